"""`tdiff distill`: model.safetensors + token ids JSONL → student.safetensors (a few-step sampler)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from tdiff.core import choices
from tdiff.cli.commands import common
from tdiff.cli.commands.training_options import TrainingRun, log_summary, training_command


@training_command(exclude=("preset",), lr=1e-4, max_steps=500, batch_size=64, warmup=20)
def distill(
    ctx: typer.Context,
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the student (safetensors, kind 'student')."),
    model: Path = typer.Option(..., "--model", "-m", help="The teacher: a model from `tdiff train` (or a progressive "
                               "student, to distil it further)."),
    method: Literal[choices.DISTILL_METHODS] = typer.Option(
        "progressive", "--method", help="progressive (rounds that halve the step count; the student samples with "
        "DDIM) or consistency (the student maps any point of the teacher's ODE to its end; multistep "
        "consistency sampling)."),
    from_steps: int = typer.Option(64, "--from-steps", min=2, max=4096,
                                   help="progressive: the teacher's steps in the first round (--to-steps times a "
                                        "power of two); consistency: the steps the teacher's ODE is cut into."),
    to_steps: int = typer.Option(4, "--to-steps", min=1, max=4096,
                                 help="The student's steps (its default in `tdiff sample`)."),
    *,
    run: TrainingRun,
):
    """Distil a model into a student that samples in a few steps. --max-steps is per round, --max-minutes
    in all (split evenly between the rounds)."""
    common.start(ctx)
    from tdiff.core.device import resolve_device
    from tdiff.training.distill import DistillConfig, distill as run_distill, plan

    plan(method, from_steps, to_steps)                  # bad step counts fail before any work
    dc = DistillConfig(method=method, from_steps=from_steps, to_steps=to_steps, batch_size=run.batch_size,
                       holdout=run.holdout, loop=run.loop)
    summary = run_distill(run.input, output, model, dc, resolve_device(run.device), run.checkpoint_for(output),
                          log_path=run.log, resume=run.resume)
    log_summary(summary)
