"""CLI conventions shared by every subcommand."""

import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli, run_tdiff
from tdiff.cli.commands.registry import COMMANDS


def test_version():
    r = run_cli(["--version"])
    assert r.returncode == 0
    assert r.stdout.decode().startswith("tdiff ")


def test_help_lists_commands():
    r = run_cli(["--help"])
    assert r.returncode == 0
    out = r.stdout.decode()
    for name, _ in COMMANDS:
        assert name in out


def test_every_command_has_help():
    for name, _ in COMMANDS:
        r = run_cli([name, "--help"])
        assert r.returncode == 0, name
        assert "--config" in r.stdout.decode() and "--dump-config" in r.stdout.decode()


def test_unknown_command_and_option_exit_2():
    assert run_cli(["no-such-command"]).returncode == 2
    r = run_cli(["clean", "--no-such-option"], input="x\n")
    assert r.returncode == 2
    assert b"Traceback" not in r.stderr


def test_python_dash_m_and_console_script_agree():
    r = subprocess.run([sys.executable, "-m", "tdiff", "--version"], capture_output=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith(b"tdiff ")


def test_startup_is_fast():
    """`tdiff --help` must not import torch (start-up under 0.3 s)."""
    code = "import sys, tdiff.cli; print('torch' in sys.modules, 'transformers' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT)
    assert r.stdout.decode().split() == ["False", "False"]
    t = time.perf_counter()
    run_tdiff(["--help"])
    assert time.perf_counter() - t < 2.0  # generous: loaded CI machines


def _click_params(name):
    import typer.main

    from tdiff.cli.main import app

    cmd = typer.main.get_command(app).commands[name]
    return {p.name: p for p in cmd.params}


@pytest.mark.parametrize("name,lr,batch", [("train-vae", 1e-3, 64), ("train", 5e-4, 64), ("train-ar", 1e-3, 32)])
def test_training_commands_share_the_loop_options(name, lr, batch):
    """Every LoopConfig option is an option of every training command, declared once (training/loop.py),
    with the command's own defaults; where the command line spells it otherwise (--ema-decay), the
    metadata's flag is its hidden old spelling."""
    from tdiff.cli.commands.training_options import loop_flag, loop_option_name
    from tdiff.training.loop import option_fields, option_name

    params = _click_params(name)
    for f in option_fields():
        assert loop_option_name(f) in params, f"{name} lacks {loop_flag(f)}"
        assert loop_flag(f) in params[loop_option_name(f)].opts
        if loop_flag(f) != f.metadata["flag"]:
            assert params[option_name(f)].hidden and f.metadata["flag"] in params[option_name(f)].opts
    for shared in ("input", "preset", "batch_size", "holdout", "device", "dtype", "seed", "log", "checkpoint",
                   "resume", "quiet", "config", "dump_config"):
        assert shared in params
    assert params["lr"].default == lr and params["batch_size"].default == batch


def test_training_dump_config_and_ranges(tmp_path):
    import yaml

    cfg = tmp_path / "t.yaml"
    cfg.write_text("lr: 0.01\nlr-decay: budget\nbatch_size: 8\nwarmup: 7\nema-decay: 0.99\n")
    r = run_cli(["train", "-o", tmp_path / "m", "--vae", tmp_path / "v", "--config", cfg, "--dump-config"])
    assert r.returncode == 0, r.stderr.decode()
    d = yaml.safe_load(r.stdout)
    assert d["lr"] == 0.01 and d["lr_decay"] == "budget" and d["batch_size"] == 8 and d["target"] == "v"
    assert d["warmup"] == 7 and d["ema_decay"] == 0.99      # config keys are the option names, as before
    for bad in (["--grad-accum", "0"], ["--lr-decay", "linear"], ["--ema-decay", "1.5"], ["--dtype", "fp8"],
                ["--preset", "huge"], ["--max-steps", "0"]):
        r = run_cli(["train-vae", "-o", tmp_path / "m", "-t", tmp_path / "t", *bad])
        assert r.returncode == 2, bad
        assert bad[0].encode() in r.stderr and b"Traceback" not in r.stderr
    for cmd, bad in (("train", ["--cond-prob", "1.5"]), ("train", ["--holdout", "0.95"]),
                     ("train-ar", ["--dropout", "1"]), ("train-vae", ["--latent-dim", "0"]),
                     ("train-vae", ["--kl-warmup", "-1"])):
        need = ["--vae", tmp_path / "v"] if cmd == "train" else ["-t", tmp_path / "t"]
        r = run_cli([cmd, "-o", tmp_path / "m", *need, *bad])
        assert r.returncode == 2, (cmd, bad)
        assert bad[0].encode() in r.stderr and b"Traceback" not in r.stderr
