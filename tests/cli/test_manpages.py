"""Every option of every subcommand is documented in its man page.

The options the three training commands share (declared once in
tdiff/cli/commands/training_options.py) are documented once, in man/tdiff-training.7,
and not repeated as option entries in the commands' own pages.
"""

import re

import pytest
import typer.main

from tdiff.cli.main import app
from tdiff.cli.commands.registry import COMMANDS
from tdiff.cli.commands.training_options import loop_flag
from tdiff.training.loop import option_fields
from conftest import ROOT

TRAINING = ("train-vae", "train", "train-ar")
USES_TRAINING_PAGE = TRAINING + ("distill",)     # distill takes the shared options except --preset
TRAINING_PAGE = "tdiff-training.7"
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def _plain(text: str) -> str:
    """Roff text with escaped hyphens as hyphens and font changes removed."""
    return re.sub(r"\\f[BIRP]", "", text.replace("\\-", "-"))


def _raw(filename: str) -> str:
    p = ROOT / "man" / filename
    assert p.exists(), f"missing man page {p}"
    return p.read_text(encoding="utf-8")


def _page(filename: str) -> str:
    return _plain(_raw(filename))


def _options(name: str):
    group = typer.main.get_command(app)
    cmd = group.commands[name]
    for param in cmd.params:
        if param.hidden:
            continue                  # an old spelling kept for one release: the page names the new one
        for opt in list(param.opts) + list(param.secondary_opts):
            if opt.startswith("-"):
                yield opt


def _mentions(page: str, opt: str) -> bool:
    """OPT occurs in PAGE as a whole option (--lr does not count as a mention of --lr-decay)."""
    return re.search(r"(?<![\w-])" + re.escape(opt) + r"(?![\w-])", page) is not None


def _entry_flags(filename: str) -> set:
    """The flags named by option entries: a `.TP` line followed by a line starting with `\\fB-`."""
    lines = _raw(filename).splitlines()
    flags = set()
    for tp, head in zip(lines, lines[1:]):
        if tp.strip() == ".TP" and _plain(head).startswith("-") and head.startswith("\\fB"):
            flags.update(_FLAG.findall(_plain(head)))
    return flags


def _shared_training_options() -> set:
    """The options every training command has with the same meaning, from their click parameters.

    An option counts as shared when all three commands have it with the same help text (the
    declaration in training_options.py); -o/--output exists in all three but means a different
    file in each, so each command documents it in its own page.
    """
    group = typer.main.get_command(app)
    helps = [{opt: p.help for p in group.commands[n].params if not p.hidden
              for opt in list(p.opts) + list(p.secondary_opts) if opt.startswith("-")} for n in TRAINING]
    common = set.intersection(*(set(h) for h in helps))
    return {o for o in common if len({h[o] for h in helps}) == 1}


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_every_option_in_man_page(name):
    pages = [_page(f"tdiff-{name}.1")]
    if name in USES_TRAINING_PAGE:
        pages.append(_page(TRAINING_PAGE))
    missing = [o for o in _options(name) if not any(_mentions(p, o) for p in pages)]
    where = f"man/tdiff-{name}.1" + (f" or man/{TRAINING_PAGE}" if name in USES_TRAINING_PAGE else "")
    assert not missing, f"{where} lacks {missing}"


def test_shared_training_options_documented_once():
    shared = _shared_training_options()
    loop_flags = {loop_flag(f) for f in option_fields()}
    assert loop_flags <= shared, f"loop options missing from a training command: {loop_flags - shared}"
    assert {"-i", "--input", "--preset", "--batch-size", "--resume", "--config"} <= shared

    documented = _entry_flags(TRAINING_PAGE)
    missing = sorted(shared - documented)
    assert not missing, f"man/{TRAINING_PAGE} has no option entry for {missing}"

    for name in USES_TRAINING_PAGE:
        filename = f"tdiff-{name}.1"
        repeated = sorted(shared & _entry_flags(filename))
        assert not repeated, (f"man/{filename} repeats shared training options {repeated}; "
                              f"they are documented in man/{TRAINING_PAGE}")
        assert "tdiff-training(7)" in _page(filename), f"man/{filename} does not point to tdiff-training(7)"

    assert "tdiff-training(7)" in _page("tdiff.1"), "man/tdiff.1 does not point to tdiff-training(7)"


def test_main_page_lists_every_command():
    page = (ROOT / "man" / "tdiff.1").read_text(encoding="utf-8").replace("\\-", "-")
    for name, _ in COMMANDS:
        assert f"tdiff-{name}" in page, name
