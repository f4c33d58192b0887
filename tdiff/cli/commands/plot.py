"""`tdiff plot`: metrics logs or frontier results → a figure (PNG, PDF or SVG)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Literal, Optional

import typer

from tdiff.cli.commands import common


def _config_option():
    """common's --config, where the positional inputs are the key `files`: a list of paths, or one path."""
    option = common.config_option()
    load = option.callback

    def callback(ctx: typer.Context, param, value):
        value = load(ctx, param, value)
        files = (ctx.default_map or {}).get("files")
        if isinstance(files, str):
            ctx.default_map["files"] = [files]
        elif files is not None and not (isinstance(files, list) and all(isinstance(f, str) for f in files)):
            raise typer.BadParameter(f"'{value}': key 'files' must be a list of paths (text), not {files!r:.60}",
                                     ctx, param)
        return value

    option.callback = callback
    return option


def plot(
    ctx: typer.Context,
    # strings, not Paths: --dump-config prints them as YAML that --config reads back
    files: List[str] = typer.Argument(..., help="Metrics logs (JSONL from a training command's --log), several "
                                      "runs overlaid; or frontier results (bench/frontier.py's JSON), merged. "
                                      "In a --config file: the key `files`, a list of paths."),
    output: Path = typer.Option(..., "--output", "-o", help="The figure; its suffix is the format (.png, .pdf, .svg)."),
    x: Literal["step", "time"] = typer.Option("step", "--x", help="Curves against the optimizer step or the "
                                             "training time."),
    title: str = typer.Option("", "--title", help="A title over the figure."),
    quiet: bool = common.quiet_option(),
    config: Optional[Path] = _config_option(),
    dump_config: bool = common.dump_config_option(),
):
    """Draw training curves (loss, learning rate, tokens/s, gradient norm) or a quality–diversity frontier."""
    common.start(ctx)
    from tdiff.core import log
    from tdiff.evaluation.plots import frontier, load_inputs, merge_frontiers, training_curves

    kind, items = load_inputs(files)
    if kind == "frontier":
        result = merge_frontiers(items, files) if len(items) > 1 else items[0]
        frontier({**result, "title": title or result.get("title", "")}, output)
    else:
        names = [n for n, _ in items]
        if len(set(names)) < len(names):                  # same file names in other folders: say which
            names = [f"{Path(f).parent.name}/{n}" for f, n in zip(files, names)]
        training_curves([(n, recs) for n, (_, recs) in zip(names, items)], output, x=x, title=title)
    log.info(f"plot: {len(items)} {'frontier file' if kind == 'frontier' else 'run'}{'s' if len(items) > 1 else ''} "
             f"→ {output}")
