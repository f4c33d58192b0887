"""`tdiff sample`: model.safetensors → generated text as JSONL on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from tdiff import choices
from tdiff.commands import common


def sample(
    ctx: typer.Context,
    model: Path = typer.Option(..., "--model", "-m",
                               help="Model from `tdiff train`, or a `tdiff train-ar` directory."),
    output: str = typer.Option("-", "--output", "-o", help="Output JSONL; - for stdout."),
    num: int = typer.Option(1, "--num", "-n", min=1, max=10_000_000, help="Number of samples."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, max=65_536, help="Samples generated together."),
    steps: int = typer.Option(12, "--steps", min=1, max=100_000, help="Solver steps (any N ≥ 1: time is continuous)."),
    solver: Literal[choices.SOLVERS] = typer.Option(
        "dpm", "--solver", help="dpm (DPM-Solver++ 2M), ddim, or ddpm (ancestral)."),
    eta: float = typer.Option(0.0, "--eta", min=0.0, max=1.0, help="DDIM η (0: deterministic; 1: ancestral-like)."),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", min=0.0, max=100.0,
        help="Decoding temperature (0: greedy). Default 0 for diffusion models (VAE logits), 1 for AR models."),
    length: int = typer.Option(0, "--length", min=0, max=1_000_000, help="AR models: at most this many new tokens (0: as many as fit)."),
    top_k: int = typer.Option(0, "--top-k", min=0, help="Sample only among the k most likely tokens (0: off)."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass (1: off)."),
    time_grid: Literal[choices.TIME_GRIDS] = typer.Option(
        "uniform", "--time-grid", help="Where the solver's steps fall: uniform in t, uniform in log-SNR, or "
        "warp (uniform in the model's training time warp; models trained with --t-sampling adaptive)."),
    round_x0: bool = typer.Option(False, "--round-x0", help="Snap every x0 estimate to the latents of the "
                                  "tokens it decodes to (decoder argmax → encoder); one VAE pass per step."),
    no_ema: bool = typer.Option(False, "--no-ema", help="Use the raw weights instead of the EMA weights."),
    device: str = common.device_option(),
    dtype: Literal[choices.DTYPES] = common.dtype_option(),
    seed: int = common.seed_option(),
    quiet: bool = common.quiet_option(),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
):
    """Generate text with a trained model; one JSON record per sample (text, ids, seed, steps, solver, time)."""
    common.start(ctx)
    import time

    from tdiff import log
    from tdiff.bundle import load_bundle
    from tdiff.device import resolve_device, torch_dtype
    from tdiff.io import JsonlWriter, open_output
    from tdiff.sample import SampleOptions, check_options, generate

    torch_dtype(dtype)
    from tdiff.ar import is_ar_dir

    if is_ar_dir(model):
        if round_x0 or time_grid != "uniform":
            from tdiff.errors import UsageError

            raise UsageError("--round-x0 and --time-grid apply to diffusion models, not to a train-ar directory")
        return _sample_ar(model, output, num, batch_size, length, 1.0 if temperature is None else temperature,
                          top_k, top_p, seed, device, dtype)
    if length:
        from tdiff.errors import UsageError

        raise UsageError("--length applies to AR models only in this version (diffusion samples choose their length)")
    temperature = 0.0 if temperature is None else temperature
    opts = SampleOptions(num=num, batch_size=batch_size, steps=steps, solver=solver, eta=eta,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, dtype=dtype,
                         time_grid=time_grid, round_x0=round_x0)
    check_options(opts)
    dev = resolve_device(device)
    bundle = load_bundle(model, dev, use_ema=not no_ema)
    t0 = time.perf_counter()
    ntok = 0
    with open_output(output) as out:
        w = JsonlWriter(out, flush_every=1)
        for rec in generate(bundle, opts, dev):
            w.write(rec)
            ntok += len(rec["ids"])
    dt = time.perf_counter() - t0
    log.info(f"sample: {num} samples, {ntok} tokens in {dt:.2f}s ({ntok / max(dt, 1e-9):.0f} tok/s), "
             f"{solver} {steps} steps on {dev}")


def _sample_ar(model, output, num, batch_size, length, temperature, top_k, top_p, seed, device, dtype):
    """`tdiff sample` on a train-ar directory: transformers `generate` with the KV cache."""
    import time

    from tdiff import log
    from tdiff.ar import generate_ar, load_ar
    from tdiff.device import resolve_device
    from tdiff.io import JsonlWriter, open_output

    dev = resolve_device(device)
    m, tok = load_ar(model, dev)
    t0 = time.perf_counter()
    ntok = 0
    with open_output(output) as out:
        w = JsonlWriter(out, flush_every=1)
        for rec in generate_ar(m, tok, num, batch_size=batch_size, max_new_tokens=length, temperature=temperature,
                               top_k=top_k, top_p=top_p, seed=seed, device=dev, dtype=dtype):
            rec["solver"] = "ar"
            w.write(rec)
            ntok += len(rec["ids"])
    dt = time.perf_counter() - t0
    log.info(f"sample: {num} AR samples, {ntok} tokens in {dt:.2f}s ({ntok / max(dt, 1e-9):.0f} tok/s) on {dev}")
