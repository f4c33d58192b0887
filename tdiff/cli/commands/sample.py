"""`tdiff sample`: model.safetensors → generated text as JSONL on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from tdiff.core import choices
from tdiff.api.loaded import RANGES as R
from tdiff.cli.commands import common


def sample(
    ctx: typer.Context,
    model: Path = typer.Option(..., "--model", "-m",
                               help="Model from `tdiff train`, or a `tdiff train-ar` directory."),
    output: str = typer.Option("-", "--output", "-o", help="Output JSONL; - for stdout."),
    num: int = typer.Option(1, "--num", "-n", min=R["n"][0], max=R["n"][1], help="Number of samples."),
    batch_size: int = typer.Option(16, "--batch-size", min=R["batch_size"][0], max=R["batch_size"][1],
                                   help="Samples generated together."),
    steps: Optional[int] = typer.Option(None, "--steps", min=R["steps"][0], max=R["steps"][1],
                                        help="Solver steps (any N ≥ 1: time is continuous). Default 12, or the "
                                             "steps a student was distilled for."),
    solver: Optional[Literal[choices.SOLVERS]] = typer.Option(
        None, "--solver", help="dpm (DPM-Solver++ 2M), ddim, ddpm (ancestral) or consistency (multistep consistency "
        "sampling, for consistency students). Default dpm, or a student's own."),
    eta: float = typer.Option(0.0, "--eta", min=R["eta"][0], max=R["eta"][1],
                              help="DDIM η (0: deterministic; 1: ancestral-like)."),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", min=R["temperature"][0], max=R["temperature"][1],
        help="Decoding temperature (0: greedy). Default 0 for diffusion models (VAE logits), 1 for AR models."),
    length: int = typer.Option(0, "--length", min=R["length"][0], max=R["length"][1],
                               help="Diffusion models: exactly this many generated tokens (after --prompt, if any); "
                                    "AR models: at most this many new tokens. 0: the model chooses."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Continue this beginning (kept verbatim; \\[ and "
                                         "\\] are literal brackets, [MASK] and [[ are refused)."),
    infill: Optional[str] = typer.Option(None, "--infill", help="Fill the [MASK:n] (n tokens) and [MASK] (--mask-len "
                                         "tokens; at the very end: a free continuation) spans of this text; \\[ "
                                         "and \\] are literal brackets."),
    edit: Optional[str] = typer.Option(None, "--edit", help="Regenerate the [[…]] spans of this text, each with as "
                                       "many tokens as it holds; the rest is kept; \\[ and \\] are literal "
                                       "brackets."),
    mask_len: int = typer.Option(8, "--mask-len", min=R["mask_len"][0], max=R["mask_len"][1],
                                 help="Tokens of a [MASK] without a number."),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="Requests JSONL ({\"prompt\": …} or {\"text\": …, "
                                        "\"mask\": [[start, end], …]}, optional \"length\", \"label\"); - for stdin. "
                                        "Other fields pass through to the output."),
    label: Optional[str] = typer.Option(None, "--label", help="Generate text of this label (models trained with "
                                        "--label-field)."),
    guidance: float = typer.Option(0.0, "--guidance", min=R["guidance"][0], max=R["guidance"][1],
                                   help="Classifier-free guidance weight towards --label (0: plain conditional "
                                        "sampling)."),
    segments: int = typer.Option(1, "--segments", min=R["segments"][0], max=R["segments"][1],
                                 help="Write text longer than the model's window: continue each sample this many "
                                      "windows, each new window given the last --overlap tokens of the text so far."),
    overlap: int = typer.Option(0, "--overlap", min=R["overlap"][0], max=R["overlap"][1],
                                help="With --segments: tokens each new window is given (0: a quarter of the "
                                     "window)."),
    max_tokens: int = typer.Option(0, "--max-tokens", min=R["max_tokens"][0], max=R["max_tokens"][1],
                                   help="Block-causal models (train --block-size): sample block by block up to this "
                                        "many tokens, past the window too; each text ends at its end-of-text "
                                        "prediction (0: the window)."),
    repetition_penalty: float = typer.Option(1.0, "--repetition-penalty", min=R["repetition_penalty"][0],
                                             max=R["repetition_penalty"][1],
                                             help="Lower the logits of tokens decoded elsewhere in the same sample "
                                                  "(1: off)."),
    top_k: int = typer.Option(0, "--top-k", min=R["top_k"][0],
                              help="Sample only among the k most likely tokens (0: off)."),
    top_p: float = common.above(typer.Option(1.0, "--top-p", max=1.0, help="Nucleus sampling mass (1: off)."), 0.0),
    time_grid: Literal[choices.TIME_GRIDS] = typer.Option(
        "uniform", "--time-grid", help="Where the solver's steps fall: uniform in t, uniform in log-SNR, or "
        "warp (uniform in the model's training time warp; models trained with --t-sampling adaptive)."),
    round_x0: bool = typer.Option(False, "--round-x0", help="Snap every x0 estimate to the latents of the "
                                  "tokens it decodes to (decoder argmax → encoder); one VAE pass per step."),
    decoder: Literal[choices.SAMPLE_DECODERS] = typer.Option(
        "auto", "--decoder", help="Latents to tokens: auto (the VAE's own decoder), parallel (every position at "
        "once; also the fast path of a VAE trained with --decoder contextual) or contextual (token by token)."),
    no_ema: bool = common.no_ema_option(),
    compile: bool = common.compile_option(),
    device: str = common.device_option(),
    dtype: Literal[choices.SAMPLE_DTYPES] = common.dtype_option("auto", auto=True),
    seed: int = common.seed_option(),
    quiet: bool = common.quiet_option(),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
):
    """Generate text with a trained model; one JSON record per sample (text, ids, index, seed, solver, and
    steps for diffusion models). Records carry no timing: a seed gives the same bytes."""
    common.start(ctx)
    import time

    from tdiff.api import load
    from tdiff.core import log, memory
    from tdiff.files.streams import JsonlWriter, display_name, iter_jsonl, open_output

    m = load(model, device, ema=not no_ema)
    requests = None if input is None else iter_jsonl(input)
    records = m.generate(num, steps=steps, solver=solver, eta=eta, temperature=temperature, top_k=top_k, top_p=top_p,
                         length=length, prompt=prompt, infill=infill, edit=edit, mask_len=mask_len, requests=requests,
                         requests_name=display_name(input) if input is not None else "requests", label=label,
                         guidance=guidance, segments=segments, overlap=overlap,
                         repetition_penalty=repetition_penalty, time_grid=time_grid, round_x0=round_x0,
                         batch_size=batch_size, seed=seed, dtype=dtype, compile=compile, decoder=decoder,
                         max_tokens=max_tokens)
    t0 = time.perf_counter()
    ntok = count = 0
    with memory.out_of_memory_errors("try a smaller --batch-size"), open_output(output) as out:
        w = JsonlWriter(out, flush_every=1)
        with log.progress() as bar:
            task = bar.add_task("sample", total=num if input is None else None, unit=" records")
            for rec in records:
                w.write(rec)
                ntok += len(rec["ids"])
                count += 1
                bar.advance(task, 1)
    dt = time.perf_counter() - t0
    if not count:
        log.info(f"sample: 0 records in {display_name(input)}: nothing to do")
        return
    what = f"{count} AR samples" if m.kind == "ar" else f"{count} samples"
    log.info(f"sample: {what}, {ntok} tokens in {dt:.2f}s ({ntok / max(dt, 1e-9):.0f} tok/s), {records.how}")
