"""`tdiff eval`: metrics of a model, its samples and its speed as one JSON object on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from tdiff.core import choices
from tdiff.cli.commands import common
from tdiff.evaluation.model_figures import NOISE_LEVELS, check_noise_levels  # torch-free module: --help stays fast

MODES_HELP = ("--model with --data (held-out data), --samples (generated texts) or --speed with --model")


@common.renamed(warmup=(("--warmup",), "warmup_batches"))
def eval_cmd(
    ctx: typer.Context,
    model: Optional[Path] = typer.Option(
        None, "--model", "-m",
        help="A vae or model safetensors file, or a `tdiff train-ar` directory (for --data and --speed)."),
    data: Optional[Path] = typer.Option(
        None, "--data", help="Held-out ids JSONL: VAE reconstruction, denoising loss, or AR perplexity of --model."),
    samples: Optional[Path] = typer.Option(
        None, "--samples", help="Generated texts JSONL ({\"text\"}, optional \"ids\"), e.g. from `tdiff sample`."),
    judge: Optional[Path] = typer.Option(
        None, "--judge", help="`tdiff train-ar` directory scoring --samples (generative perplexity)."),
    references: Optional[Path] = typer.Option(
        None, "--references",
        help="Reference texts JSONL paired in order with --samples: BLEU, ROUGE-L, lengths "
             "(also the real texts for the judge when --real is not given)."),
    real: Optional[Path] = typer.Option(
        None, "--real", help="Real texts JSONL for the judge's real/shuffled perplexities and q."),
    train: Optional[Path] = typer.Option(
        None, "--train", help="Training data JSONL (ids or text): 4-gram overlap of --samples with it."),
    classifier: Optional[Literal[choices.CLASSIFIERS]] = typer.Option(
        None, "--classifier",
        help="External classifier for the label accuracy of --samples whose records carry a \"label\" (e.g. "
             "`tdiff sample --label pos --guidance 2`): snownlp = the snownlp package's sentiment model "
             "(labels pos/neg; pip install snownlp)."),
    speed: bool = typer.Option(False, "--speed", help="Time sampling with --model (tokens/s, latency p50/p95)."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, max=100_000,
                                        help="--speed: solver steps (diffusion models; default 12, or a student's own)."),
    solver: Optional[Literal[choices.SOLVERS]] = typer.Option(
        None, "--solver", help="--speed: the solver (diffusion models; default dpm, or a student's own)."),
    batch_size: int = typer.Option(1, "--batch-size", min=1, max=65_536, help="--speed: samples per timed batch."),
    length: int = typer.Option(
        0, "--length", min=0, max=1_000_000,
        help="--speed, AR models: new tokens per sample (0: 128 or what fits). Diffusion models have a fixed length."),
    repeats: int = typer.Option(5, "--repeats", min=1, max=100_000, help="--speed: timed batches."),
    warmup_batches: int = typer.Option(1, "--warmup-batches", min=0, max=100_000,
                                       help="--speed: untimed batches before the timed --repeats."),
    max_records: int = typer.Option(0, "--max-records", min=0, help="Use at most N records of each input file (0: all)."),
    t_samples: int = typer.Option(4, "--t-samples", min=1, max=1000,
                                  help="Denoising loss: passes over --data, each with fresh t and noise."),
    noise_levels: str = typer.Option(
        ",".join(f"{t:g}" for t in NOISE_LEVELS), "--noise-levels",
        help="--data, diffusion models: noise levels t (comma-separated, each in (0, 1)) at which to report "
             "the token accuracy of decoding the noisy latent directly and the denoiser's x0 estimate, and "
             "the denoiser's loss; 'none' skips it."),
    output: str = typer.Option("-", "--output", "-o", help="Output JSON file; - for stdout."),
    compile: bool = common.compile_option(),
    device: str = common.device_option(),
    no_ema: bool = common.no_ema_option(),
    dtype: Literal[choices.SAMPLE_DTYPES] = common.dtype_option("auto", auto=True),
    seed: int = common.seed_option(),
    quiet: bool = common.quiet_option(),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
):
    """Evaluate a model, its samples and its speed; print one JSON object of metrics (table on stderr)."""
    common.start(ctx)
    import contextlib
    import json
    import time

    from tdiff.core import log
    from tdiff.core.errors import NoInputError, UsageError
    from tdiff.evaluation.report import evaluate_model, evaluate_samples, read_sample_inputs

    if data is None and samples is None and not speed:
        raise UsageError(f"nothing to evaluate: select a mode with {MODES_HELP}")
    if (data is not None or speed) and model is None:
        raise UsageError(f"{'--data' if data is not None else '--speed'} needs -m/--model")
    if compile and not speed:
        raise UsageError("--compile: only with --speed (it times compiled sampling)")
    if model is not None and data is None and not speed:
        raise UsageError("-m/--model is used with --data or --speed; add one of them")
    for opt, val in (("--judge", judge), ("--references", references), ("--real", real), ("--train", train),
                     ("--classifier", classifier)):
        if val is not None and samples is None:
            raise UsageError(f"{opt} applies to --samples; give --samples FILE")
    if max_records < 0:
        raise UsageError("--max-records must be ≥ 0")
    levels = _parse_levels(noise_levels)

    t_start = time.perf_counter()
    for opt, val in (("-m/--model", model), ("--data", data), ("--judge", judge), ("--train", train)):
        if val is not None and str(val) != "-" and not val.exists():
            raise NoInputError(f"{opt} '{val}' does not exist")
    # Text inputs first: they are cheap, and a missing or malformed file fails before any model loads.
    texts = None
    if samples is not None:
        texts = read_sample_inputs(samples, references=references, real=real, max_records=max_records)
    dev = None
    if model is not None or judge is not None:
        from tdiff.core.device import resolve_device, resolve_dtype

        dev = resolve_device(device)
        dtype = resolve_dtype(dtype, dev)

    result: dict = {}
    with contextlib.ExitStack() as bars:          # a progress line on a terminal: which stage is running
        bar = bars.enter_context(log.progress())
        task = bar.add_task("eval", total=None, unit=" stages done")

        def stage(name):
            bar.update(task, description=f"eval: {name}")

        if model is not None:
            result.update(evaluate_model(model, dev, data=data, speed=speed, dtype=dtype, use_ema=not no_ema,
                                         seed=seed, max_records=max_records, t_samples=t_samples, levels=levels,
                                         steps=steps, solver=solver, batch_size=batch_size, length=length,
                                         repeats=repeats, warmup_batches=warmup_batches, compile=compile,
                                         stage=stage))
        if texts is not None:
            smp, refs, real_recs = texts
            result.update(evaluate_samples(smp, dev, refs=refs, real_recs=real_recs, judge=judge, train=train,
                                           classifier=classifier, seed=seed, dtype=dtype, stage=stage))
    from tdiff.files.streams import open_output

    with open_output(output) as out:
        out.write(json.dumps(_finite(result), ensure_ascii=False, allow_nan=False) + "\n")
    _show(result, time.perf_counter() - t_start)


def _parse_levels(text: str) -> tuple:
    """--noise-levels "0.5,0.7" → (0.5, 0.7); "none" or "" → ()."""
    from tdiff.core.errors import UsageError

    if text.strip().lower() in ("", "none"):
        return ()
    try:
        levels = [float(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--noise-levels {text!r}: expected comma-separated numbers in (0, 1), or none") from None
    return check_noise_levels(levels)


def _finite(v):
    """NaN and ±inf become null: the output stays strict JSON (jq, other languages)."""
    import math

    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _rows(result: dict):
    for group, d in result.items():
        for key, v in d.items():
            if isinstance(v, dict):
                for k2, v2 in v.items():
                    if isinstance(v2, dict):
                        yield group, f"{key}.{k2}", " ".join(f"{a}={_fmt(b)}" for a, b in v2.items())
                    else:
                        yield group, f"{key}.{k2}", _fmt(v2)
            else:
                yield group, key, _fmt(v)


def _show(result: dict, seconds: float) -> None:
    """A rich table on stderr when it is a terminal (and not --quiet); else one summary line."""
    from tdiff.core import log

    if log.progress_enabled():
        from rich.table import Table

        table = Table(title=f"tdiff eval ({seconds:.1f}s)", show_lines=False)
        table.add_column("group")
        table.add_column("metric")
        table.add_column("value", justify="right")
        last = None
        for group, key, val in _rows(result):
            table.add_row(group if group != last else "", key, val)
            last = group
        log.console().print(table)
    else:
        log.info(f"eval: {', '.join(result)} in {seconds:.1f}s")
