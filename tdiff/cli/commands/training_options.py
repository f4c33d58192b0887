"""The options every training command shares (train-vae, train, train-ar), declared once.

`@training_command(lr=5e-4, ...)` adds them to a command: the input, the size preset,
batch size and held-out share, every loop option of `LoopConfig` (built from the
dataclass's fields and their metadata: tdiff/training/loop.py), device, dtype and seed,
the metrics log, the checkpoint and `--resume`, and the common `--quiet`, `--config`
and `--dump-config`. Keyword arguments give a command its own defaults. The command
function declares only its own options plus a keyword-only `run: TrainingRun`, which
the decorator fills in.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

import typer

from tdiff.core import choices
from tdiff.cli.commands import common
from tdiff.core.errors import AfterTrainingError
from tdiff.training.loop import LoopConfig, option_fields, option_name


@dataclass
class TrainingRun:
    """The shared options of one training command, parsed."""

    input: str
    preset: str
    batch_size: int
    holdout: float
    loop: LoopConfig
    device: str
    log: Optional[Path]
    checkpoint: Optional[Path]
    resume: bool

    def checkpoint_for(self, output: Path) -> Path:
        """--checkpoint, or OUTPUT with suffix .ckpt.safetensors beside it."""
        if self.checkpoint is not None:
            return self.checkpoint
        name = output.name[: -len(".safetensors")] if output.name.endswith(".safetensors") else output.name
        return output.with_name(name + ".ckpt.safetensors")


def _head_options(d: dict) -> list:
    """(name, annotation, typer.Option) of the options that come first in --help."""
    return [("input", str, typer.Option(
        d.get("input", "-"), "--input", "-i",
        help="Token ids JSONL ({\"ids\": [...]}) from `tdiff tokenize`; - for stdin."))]


def _shared_options(d: dict) -> list:
    """(name, annotation, typer.Option) of the shared options after a command's own, in --help order."""
    out = [
        ("preset", Literal[choices.PRESETS], typer.Option(
            d.get("preset", "tiny"), "--preset", help="Size preset: tiny (minutes on a CPU), small, base.")),
        ("batch_size", int, typer.Option(d.get("batch_size", 64), "--batch-size", min=1,
                                         help="Sequences per micro-batch.")),
    ]
    types = typing.get_type_hints(LoopConfig)
    for f in option_fields():
        m = f.metadata
        ann = Literal[m["choices"]] if "choices" in m else types[f.name]
        name = loop_option_name(f)
        out.append((name, ann, typer.Option(d.get(name, f.default), loop_flag(f), help=m["help"],
                                            min=m.get("min"), max=m.get("max"))))
    out += [
        ("holdout", float, typer.Option(
            d.get("holdout", 0.02), "--holdout", min=0.0, max=0.9,
            help="Fraction of records held out for evaluation (chosen by a hash of each record, the same in "
                 "every command).")),
        ("device", str, common.device_option()),
        ("dtype", Literal[choices.DTYPES], common.dtype_option()),
        ("seed", int, common.seed_option()),
        ("log", Optional[Path], typer.Option(
            None, "--log", help="Append metrics as JSONL to this file (step, loss, lr, grad_norm, tokens_per_s).")),
        ("checkpoint", Optional[Path], typer.Option(
            None, "--checkpoint", help="Training checkpoint file (default: OUTPUT with suffix .ckpt.safetensors); "
                                       "written atomically every --ckpt-every steps and at the end.")),
        ("resume", bool, typer.Option(False, "--resume", help="Continue from the training checkpoint if it exists.")),
        ("quiet", bool, common.quiet_option()),
        ("config", Optional[Path], common.config_option()),
        ("dump_config", bool, common.dump_config_option()),
    ]
    return out


# Input files of the training commands, by parameter name: none may also be an output.
_INPUT_OPTIONS = {"tokenizer": "-t/--tokenizer", "vae": "--vae", "model": "-m/--model", "align": "--align",
                  "encoder": "--encoder"}

# LoopConfig fields whose flag here is not the one in their metadata: the command line's one vocabulary
# (--ema-decay, a number, is not the opposite of sample's --no-ema). The metadata's flag stays a hidden
# alias for one release (common.renamed), and with it its --config key.
_FLAGS = {"ema_decay": "--ema-decay"}


def loop_flag(f) -> str:
    """The flag of LoopConfig field F's option."""
    return _FLAGS.get(f.name, f.metadata["flag"])


def loop_option_name(f) -> str:
    """The parameter name of LoopConfig field F's option, its key in --config files."""
    return loop_flag(f).lstrip("-").replace("-", "_")


_LOOP_NAMES = {loop_option_name(f): f.name for f in option_fields()}     # option → LoopConfig field
_OLD_FLAGS = {option_name(f): ((f.metadata["flag"],), loop_option_name(f)) for f in option_fields() if f.name in _FLAGS}


def training_command(exclude: tuple = (), **defaults):
    """Decorator: give a training command the shared options (module docstring), except those
    named in EXCLUDE (e.g. "preset" for `distill`, whose student has its teacher's size).

    The decorated function has the signature ``(ctx, <own options>, *, run: TrainingRun)``.
    """
    def wrap(func):
        hints = typing.get_type_hints(func)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in inspect.signature(func).parameters.values() if p.name != "run"]
        if own[0].name != "ctx":
            raise TypeError(f"{func.__name__}: the first parameter must be ctx: typer.Context")
        head = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o, annotation=a)
                for n, a, o in _head_options(defaults)]
        tail = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=o, annotation=a)
                for n, a, o in _shared_options(defaults) if n not in exclude]
        shared = {p.name for p in head + tail}
        clash = shared & {p.name for p in own}
        if clash:
            raise TypeError(f"{func.__name__}: declares shared training options itself: {', '.join(sorted(clash))}")
        params = [own[0], *head, *own[1:], *tail]

        @functools.wraps(func)
        def wrapper(ctx, **kw):
            loop = LoopConfig(**{field: kw.pop(opt) for opt, field in _LOOP_NAMES.items()},
                              dtype=kw["dtype"], seed=kw["seed"])
            run = TrainingRun(input=kw.pop("input"), preset=kw.pop("preset", ""), batch_size=kw.pop("batch_size"),
                              holdout=kw.pop("holdout"), loop=loop, device=kw.pop("device"), log=kw.pop("log"),
                              checkpoint=kw.pop("checkpoint"), resume=kw.pop("resume"))
            from tdiff.core import log
            from tdiff.training import distributed

            run.device = distributed.setup(run.device)          # torchrun: join the group, pick this rank's device
            if not distributed.is_main():
                log.set_quiet(True)                             # rank 0 reports; warnings and errors still show
            try:
                world = distributed.world_size()
                bs, accum = distributed.share_out(run.batch_size, loop.grad_accum, world)
                if (bs, accum) != (run.batch_size, loop.grad_accum):
                    log.info(f"{world} processes: each batch of {run.batch_size * loop.grad_accum} is shared out as "
                             f"{accum} micro-batches of {bs} (the run that one process makes with "
                             f"--batch-size {bs} --grad-accum {accum})")
                    run.batch_size, run.loop = bs, dataclasses.replace(loop, grad_accum=accum)
                if "output" in kw and not kw["dump_config"] and distributed.is_main():
                    from tdiff.files.streams import check_output, refuse_same_file

                    output, ckpt = kw["output"], run.checkpoint_for(Path(kw["output"]))
                    refuse_same_file({opt: kw.get(name) for name, opt in _INPUT_OPTIONS.items()} | {"-i/--input": run.input},
                                     {"-o/--output": output, "--checkpoint": ckpt, "--log": run.log})
                    check_output(output, "-o/--output", directory=ctx.info_name == "train-ar")
                    check_output(ckpt, "--checkpoint")
                    if run.log is not None:
                        check_output(run.log, "--log")
                for n in ("dtype", "seed", "quiet", "config", "dump_config"):
                    kw.pop(n)
                return func(ctx, run=run, **kw)
            except AfterTrainingError as e:
                raise AfterTrainingError(f"{e}; finish the job with: {resume_command(ctx, e.checkpoint)}",
                                         e.checkpoint, e.exit_code) from None
            finally:
                distributed.teardown()

        wrapper.__signature__ = inspect.Signature(params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__          # typer must see the new signature, not the function's own
        return common.renamed(**_OLD_FLAGS)(wrapper)

    return wrap


def resume_command(ctx, checkpoint) -> str:
    """The command line that was run, with --resume (and --checkpoint, so that another -o still finds
    it): after a failure past training it reloads the final checkpoint, trains no further step and
    does what is left."""
    import shlex
    import sys

    argv = list((ctx.find_root().obj or {}).get("argv") or sys.argv[1:])
    if argv[:1] == ["--"]:
        argv = argv[1:]                                   # torchrun … -m tdiff -- train …
    if "--checkpoint" not in argv and not any(a.startswith("--checkpoint=") for a in argv):
        argv += ["--checkpoint", str(checkpoint)]
    if "--resume" not in argv:
        argv.append("--resume")
    return shlex.join(["tdiff", *argv])


def log_summary(summary: dict) -> None:
    """The end-of-run summary as one JSON line on stderr (stdout carries data only)."""
    import json

    from tdiff.core import log

    log.info("summary " + json.dumps(summary, ensure_ascii=False))
