"""CLI conventions shared by every subcommand (SPEC §1)."""

import subprocess
import sys
import time

from conftest import ROOT, run_tdiff
from tdiff.commands.registry import COMMANDS


def test_version():
    r = run_tdiff(["--version"])
    assert r.returncode == 0
    assert r.stdout.decode().startswith("tdiff ")


def test_help_lists_commands():
    r = run_tdiff(["--help"])
    assert r.returncode == 0
    out = r.stdout.decode()
    for name, _ in COMMANDS:
        assert name in out


def test_every_command_has_help():
    for name, _ in COMMANDS:
        r = run_tdiff([name, "--help"])
        assert r.returncode == 0, name
        assert "--config" in r.stdout.decode() and "--dump-config" in r.stdout.decode()


def test_unknown_command_and_option_exit_2():
    assert run_tdiff(["no-such-command"]).returncode == 2
    r = run_tdiff(["clean", "--no-such-option"], input="x\n")
    assert r.returncode == 2
    assert b"Traceback" not in r.stderr


def test_python_dash_m_and_console_script_agree():
    r = subprocess.run([sys.executable, "-m", "tdiff", "--version"], capture_output=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith(b"tdiff ")


def test_startup_is_fast():
    """`tdiff --help` must not import torch (SPEC §6: < 0.3 s start-up)."""
    code = "import sys, tdiff.cli; print('torch' in sys.modules, 'transformers' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT)
    assert r.stdout.decode().split() == ["False", "False"]
    t = time.perf_counter()
    run_tdiff(["--help"])
    assert time.perf_counter() - t < 2.0  # generous: loaded CI machines
