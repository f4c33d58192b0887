"""`tdiff export`: model.safetensors → a deployable directory (slim safetensors, torch.export,
TorchScript or ONNX programs), verified against the source before success is reported."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from tdiff.core import choices
from tdiff.cli.commands import common


def export(
    ctx: typer.Context,
    model: Path = typer.Option(..., "--model", "-m", help="A model from `tdiff train` or a student from "
                               "`tdiff distill`."),
    output: Path = typer.Option(..., "--output", "-o", help="The directory to write (created; an empty one is "
                                "filled, an earlier `tdiff export` directory whose files still match its "
                                "manifest is replaced, any other refused; through a symlink, its target)."),
    format: Literal[choices.EXPORT_FORMATS] = typer.Option(
        "safetensors", "--format", "-f", help="safetensors (slim model file for `tdiff sample`), export "
        "(torch.export programs), torchscript, or onnx (needs the onnx extra)."),
    dtype: Literal[choices.DTYPES] = typer.Option("fp32", "--dtype", help="The weights' precision in the export "
                                                  "(inputs and outputs of programs stay fp32)."),
    no_ema: bool = common.no_ema_option(),
    quiet: bool = common.quiet_option(),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
):
    """Export a model for deployment; every file is checked against the source model (figures on stderr)."""
    common.start(ctx)
    import time

    from tdiff.core import log
    from tdiff.core.errors import UsageError
    from tdiff.export.programs import TOLERANCE, export_model

    if str(output) == "-":
        raise UsageError("-o/--output: export writes a directory, not stdout")
    if format == "onnx" and dtype == "bf16":
        raise UsageError("--format onnx --dtype bf16: ONNX Runtime's CPU kernels have no bf16 matrix product; "
                         "use fp16 or fp32")
    t0 = time.perf_counter()
    report = export_model(model, output, format, dtype, use_ema=not no_ema)
    for name, c in report["checks"].items():
        log.info(f"export: {name}: {c['file']}: max |export - source| / max |source| = {c['rel_error']:.2e} "
                 f"(tolerance {c['tolerance']:g})")
    total = sum(report["files"].values())
    log.info(f"export: {format}, {dtype} weights: {output} ({len(report['files'])} files, {total / 1e6:.1f} MB; "
             f"source {report['source_bytes'] / 1e6:.1f} MB), verified in {time.perf_counter() - t0:.1f}s "
             f"(tolerance for {dtype}: {TOLERANCE[dtype]:g})")
