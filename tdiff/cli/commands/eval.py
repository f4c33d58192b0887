"""`tdiff eval`: metrics of a model, its samples and its speed as one JSON object on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from tdiff.core import choices
from tdiff.cli.commands import common
from tdiff.evaluation.evaluate import NOISE_LEVELS, check_noise_levels  # torch-free module: --help stays fast

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
    import json
    import time

    from tdiff.evaluation import evaluate as E
    from tdiff.core import log, memory
    from tdiff.core.errors import UsageError

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
    result: dict = {}
    for opt, val in (("-m/--model", model), ("--data", data), ("--judge", judge), ("--train", train)):
        if val is not None and str(val) != "-" and not val.exists():
            from tdiff.core.errors import NoInputError

            raise NoInputError(f"{opt} '{val}' does not exist")
    # Text inputs first: they are cheap, and a missing or malformed file fails before any model loads.
    smp = refs = real_recs = None
    if samples is not None:
        smp = E.read_texts(samples, max_records=max_records, opt="--samples")
        if not smp.texts:
            from tdiff.core.errors import DataError

            raise DataError(f"{smp.path}: no sample records")
        if references is not None:
            refs = E.read_texts(references, max_records=max_records, opt="--references")
        real_recs = E.read_texts(real, max_records=max_records, opt="--real") if real is not None else refs
    dev = None
    if model is not None or judge is not None:
        from tdiff.core.device import resolve_device, resolve_dtype

        dev = resolve_device(device)
        dtype = resolve_dtype(dtype, dev)

    import contextlib

    bars = contextlib.ExitStack()                 # a progress line on a terminal: which stage is running
    bar = bars.enter_context(log.progress())
    import atexit

    atexit.register(bars.close)                   # an error below still ends the display cleanly
    task = bar.add_task("eval", total=None, unit=" stages done")

    def stage(name):
        bar.update(task, description=f"eval: {name}")

    if model is not None:
        kind = E.model_kind(model)
        if kind == "ar":
            from tdiff.formats.ar_dir import load_ar

            ar_model, ar_tok = load_ar(model, dev)
            if data is not None:
                seqs = E.read_heldout_ids(data, ar_tok.vocab_size, max_records)
                stage("held-out perplexity")
                result["perplexity"] = E.ar_perplexity(ar_model, seqs, dev, dtype)
            if compile:
                raise UsageError("--compile: diffusion models only, not a train-ar directory")
            if speed:
                _check_ar_memory(ar_model, batch_size, length, dev)
                stage("speed")
                with memory.out_of_memory_errors("try a smaller --batch-size"):
                    result["speed"] = E.speed_ar(ar_model, ar_tok, dev, length=length, batch_size=batch_size,
                                                 repeats=repeats, warmup=warmup_batches, seed=seed, dtype=dtype)
        else:
            from tdiff.formats.model import load_model, load_vae

            bundle = load_model(model, dev, use_ema=not no_ema) if kind == "model" else None
            if bundle is not None:
                vae, tok = bundle.vae, bundle.tokenizer
            else:
                vae, tok, _ = load_vae(model, dev)
            if data is not None:
                seqs = E.read_heldout_ids(data, tok.vocab_size, max_records)
                stage("held-out reconstruction and denoising")
                result["reconstruction"] = E.reconstruction(vae, tok, seqs, dev, dtype)
                if bundle is not None:
                    result["denoising"] = E.denoising(bundle, seqs, dev, seed=seed, t_samples=t_samples, dtype=dtype)
                    if levels:
                        result["noise_levels"] = E.noise_levels(bundle, seqs, dev, levels, seed=seed, dtype=dtype)
            if speed:
                if bundle is None:
                    raise UsageError(f"--speed: '{model}' is a VAE file, not a diffusion model")
                if length and length != vae.config.max_len:
                    log.warn(f"--length {length} ignored: this diffusion model samples a fixed "
                             f"{vae.config.max_len} positions")
                from tdiff.sampling.sample import SampleOptions, check_memory, sampling_plan

                steps, solver, notes = sampling_plan(bundle, steps, solver)
                for line in notes:
                    (log.warn if line.startswith("warning: ") else log.info)(f"eval: {line.removeprefix('warning: ')}")
                check_memory(bundle, SampleOptions(batch_size=batch_size), batch_size, dev)
                stage("speed")
                with memory.out_of_memory_errors("try a smaller --batch-size"):
                    result["speed"] = E.speed_diffusion(bundle, dev, steps=steps, solver=solver,
                                                        batch_size=batch_size, repeats=repeats, warmup=warmup_batches,
                                                        seed=seed, dtype=dtype, compile=compile)

    if smp is not None:
        stage("samples")
        real_texts = real_recs.texts if real_recs is not None else None
        judge_model = judge_tok = None
        if judge is not None:
            from tdiff.formats.ar_dir import load_ar

            judge_model, judge_tok = load_ar(judge, dev)
        result["samples"] = E.sample_metrics(smp.texts, smp.ids, judge_tok, real_texts)
        if smp.requests is not None:
            result["control"] = E.control_metrics(smp.texts, smp.requests)
        if classifier is not None:
            result["labels"] = E.label_accuracy(smp.texts, smp.labels or [], classifier, where=smp.path)
        if judge_model is not None:
            result["judge"] = E.judge_metrics(judge_model, judge_tok, smp.texts, real_texts, seed=seed,
                                              device=dev, dtype=dtype)
        if train is not None:
            result["memorization"] = E.memorization(smp, train)
        if refs is not None:
            result["references"] = E.reference_metrics(smp.texts, refs.texts)
            if len(refs.texts) != len(smp.texts):
                log.warn(f"{len(smp.texts)} samples but {len(refs.texts)} references: BLEU and ROUGE-L pair "
                         f"the first {min(len(smp.texts), len(refs.texts))} in order")

    bars.close()
    from tdiff.files.streams import open_output

    with open_output(output) as out:
        out.write(json.dumps(_finite(result), ensure_ascii=False, allow_nan=False) + "\n")
    _show(result, time.perf_counter() - t_start)


def _check_ar_memory(model, batch_size: int, length: int, device) -> None:
    """--speed on an AR model: a UsageError naming --batch-size when its KV cache cannot fit DEVICE
    (LENGTH new tokens; 0: 128 or what fits, as `evaluate.speed_ar` takes it)."""
    from tdiff.core import memory

    c = model.config
    positions = 1 + min(length or 128, c.n_positions - 1)
    memory.check_fits([(memory.kv_cache_bytes(batch_size, positions, c.n_embd, c.n_layer, c.vocab_size),
                        "the keys and values of every position", f"--batch-size {batch_size}")], device)


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
