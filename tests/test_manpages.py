"""Every option of every subcommand is documented in its man page."""

import re

import pytest
import typer.main

from tdiff.cli import app
from tdiff.commands.registry import COMMANDS
from conftest import ROOT


def _page(name: str) -> str:
    p = ROOT / "man" / f"tdiff-{name}.1"
    assert p.exists(), f"missing man page {p}"
    return p.read_text(encoding="utf-8").replace("\\-", "-").replace("\\f[BIRP]", "")


def _options(name: str):
    group = typer.main.get_command(app)
    cmd = group.commands[name]
    for param in cmd.params:
        for opt in list(param.opts) + list(param.secondary_opts):
            if opt.startswith("-"):
                yield opt


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_every_option_in_man_page(name):
    page = re.sub(r"\\f[BIRP]", "", _page(name))
    missing = [o for o in _options(name) if o not in page]
    assert not missing, f"man/tdiff-{name}.1 lacks {missing}"


def test_main_page_lists_every_command():
    page = (ROOT / "man" / "tdiff.1").read_text(encoding="utf-8").replace("\\-", "-")
    for name, _ in COMMANDS:
        assert f"tdiff-{name}" in page, name
