"""`tdiff info FILE|DIR`: one JSON object saying what an artifact is (tdiff/formats/info.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tdiff.cli.commands import common


def info(
    ctx: typer.Context,
    path: Path = typer.Argument(..., metavar="FILE|DIR", help="A vae, model, student, export or checkpoint "
                                "file, a tokenizer model, a `tdiff train-ar` directory or a `tdiff export` directory."),
    quiet: bool = common.quiet_option(),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
):
    """Say what an artifact is: kind, parameter counts, window, tokenizer, schedule, training provenance
    (steps, minutes, seed, data fingerprint, tdiff version) and sha256, as one JSON object on stdout.
    Reads headers only: no tensor is loaded."""
    common.start(ctx)
    import json
    import sys

    from tdiff.formats.info import describe

    sys.stdout.write(json.dumps(describe(path), ensure_ascii=False) + "\n")
