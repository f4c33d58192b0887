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
    steps: Optional[int] = typer.Option(None, "--steps", min=1, max=100_000,
                                        help="Solver steps (any N ≥ 1: time is continuous). Default 12, or the "
                                             "steps a student was distilled for."),
    solver: Optional[Literal[choices.SOLVERS]] = typer.Option(
        None, "--solver", help="dpm (DPM-Solver++ 2M), ddim, ddpm (ancestral) or consistency (multistep consistency "
        "sampling, for consistency students). Default dpm, or a student's own."),
    eta: float = typer.Option(0.0, "--eta", min=0.0, max=1.0, help="DDIM η (0: deterministic; 1: ancestral-like)."),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", min=0.0, max=100.0,
        help="Decoding temperature (0: greedy). Default 0 for diffusion models (VAE logits), 1 for AR models."),
    length: int = typer.Option(0, "--length", min=0, max=1_000_000,
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
    mask_len: int = typer.Option(8, "--mask-len", min=1, max=100_000, help="Tokens of a [MASK] without a number."),
    input: Optional[str] = typer.Option(None, "--input", "-i", help="Requests JSONL ({\"prompt\": …} or {\"text\": …, "
                                        "\"mask\": [[start, end], …]}, optional \"length\", \"label\"); - for stdin. "
                                        "Other fields pass through to the output."),
    label: Optional[str] = typer.Option(None, "--label", help="Generate text of this label (models trained with "
                                        "--label-field)."),
    guidance: float = typer.Option(0.0, "--guidance", min=0.0, max=100.0, help="Classifier-free guidance weight "
                                   "towards --label (0: plain conditional sampling)."),
    segments: int = typer.Option(1, "--segments", min=1, max=1000, help="Write text longer than the model's window: "
                                 "continue each sample this many windows, each new window given the last --overlap "
                                 "tokens of the text so far."),
    overlap: int = typer.Option(0, "--overlap", min=0, max=100_000, help="With --segments: tokens each new window is "
                                "given (0: a quarter of the window)."),
    repetition_penalty: float = typer.Option(1.0, "--repetition-penalty", min=1.0, max=100.0,
                                             help="Lower the logits of tokens decoded elsewhere in the same "
                                                  "sample (1: off)."),
    top_k: int = typer.Option(0, "--top-k", min=0, help="Sample only among the k most likely tokens (0: off)."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass (1: off)."),
    time_grid: Literal[choices.TIME_GRIDS] = typer.Option(
        "uniform", "--time-grid", help="Where the solver's steps fall: uniform in t, uniform in log-SNR, or "
        "warp (uniform in the model's training time warp; models trained with --t-sampling adaptive)."),
    round_x0: bool = typer.Option(False, "--round-x0", help="Snap every x0 estimate to the latents of the "
                                  "tokens it decodes to (decoder argmax → encoder); one VAE pass per step."),
    no_ema: bool = typer.Option(False, "--no-ema", help="Use the raw weights instead of the EMA weights."),
    compile: bool = common.compile_option(),
    device: str = common.device_option(),
    dtype: Literal[choices.SAMPLE_DTYPES] = common.dtype_option("auto", auto=True),
    seed: int = common.seed_option(),
    quiet: bool = common.quiet_option(),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
):
    """Generate text with a trained model; one JSON record per sample (text, ids, seed, steps, solver, time)."""
    common.start(ctx)
    import time

    from tdiff import log, memory
    from tdiff.ar import is_ar_dir
    from tdiff.bundle import load_bundle
    from tdiff.device import resolve_device, resolve_dtype, torch_dtype
    from tdiff.errors import UsageError
    from tdiff.io import JsonlWriter, open_output
    from tdiff.sample import SampleOptions, check_memory, check_options, generate, generate_long, sampling_plan

    if is_ar_dir(model):
        given = [n for n, v in (("--round-x0", round_x0), ("--time-grid", time_grid != "uniform"),
                                ("--infill", infill is not None),
                                ("--edit", edit is not None), ("--input", input is not None),
                                ("--label", label is not None), ("--guidance", guidance > 0),
                                ("--repetition-penalty", repetition_penalty != 1.0),
                                ("--segments", segments > 1), ("--compile", compile)) if v]
        if given:
            raise UsageError(f"{', '.join(given)}: diffusion models only, not a train-ar directory")
        return _sample_ar(model, output, num, batch_size, length, 1.0 if temperature is None else temperature,
                          top_k, top_p, seed, device, dtype, prompt)
    if input is not None and any(v is not None for v in (prompt, infill, edit)):
        raise UsageError("--input: the requests come from the file; drop --prompt/--infill/--edit")
    temperature = 0.0 if temperature is None else temperature
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype, dev)
    torch_dtype(dtype)
    bundle = load_bundle(model, dev, use_ema=not no_ema)
    steps, solver, notes = sampling_plan(bundle, steps, solver)
    for line in notes:
        if line.startswith("warning: "):
            log.warn(f"sample: {line[len('warning: '):]}")
        else:
            log.info(f"sample: {model}: {line}")
    opts = SampleOptions(num=num, batch_size=batch_size, steps=steps, solver=solver, eta=eta,
                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, dtype=dtype,
                         time_grid=time_grid, round_x0=round_x0, guidance=guidance,
                         repetition_penalty=repetition_penalty)
    check_options(opts)
    requests = _requests(bundle, input, num, prompt=prompt, infill=infill, edit=edit, length=length,
                         mask_len=mask_len, label=label)
    first, requests = _first_batch(requests, batch_size, num)
    check_memory(bundle, opts, first, dev)               # before a batch is allocated
    if compile:
        from tdiff.compiled import compile_bundle

        bundle = compile_bundle(bundle, dev, batch_size * (2 if guidance else 1))
        log.info("sample: --compile: the first batch compiles the networks (10-30 s)")
    t0 = time.perf_counter()
    ntok = count = 0
    with memory.out_of_memory_errors("try a smaller --batch-size"), open_output(output) as out:
        w = JsonlWriter(out, flush_every=1)
        if segments > 1:
            from tdiff.sample import check_spans

            check_spans(bundle)                           # later windows continue through known spans
            window = bundle.vae.config.max_len
            records = generate_long(bundle, opts, dev, requests, segments=segments, overlap=overlap or window // 4)
        else:
            records = generate(bundle, opts, dev, requests)
        with log.progress() as bar:
            task = bar.add_task("sample", total=num if input is None else None, unit=" records")
            for rec in records:
                w.write(rec)
                ntok += len(rec["ids"])
                count += 1
                bar.advance(task, 1)
    dt = time.perf_counter() - t0
    if not count:
        from tdiff.io import display_name

        log.info(f"sample: 0 records in {display_name(input)}: nothing to do")
        return
    log.info(f"sample: {count} samples, {ntok} tokens in {dt:.2f}s ({ntok / max(dt, 1e-9):.0f} tok/s), "
             f"{solver} {steps} steps on {dev}, {dtype}{', compiled' if compile else ''}")


def _first_batch(requests, batch_size: int, num: int):
    """(the size of the first batch, REQUESTS unchanged): the requests of --input are read one batch
    ahead, so that a short file is not refused for a --batch-size it never fills."""
    import itertools

    if requests is None:
        return min(batch_size, num), None
    ahead = list(itertools.islice(requests, batch_size))
    return len(ahead), itertools.chain(ahead, requests)


def _requests(bundle, input, num, *, prompt, infill, edit, length, mask_len, label):
    """The templates to generate (tdiff/control.py): each of --input's records, or the one of the
    options, --num times; None for plain unconditional samples."""
    import itertools

    from tdiff import control
    from tdiff.sample import check_spans, label_index

    window = bundle.vae.config.max_len
    tok = bundle.tokenizer
    if input is None:
        if prompt is None and infill is None and edit is None and not length and label is None:
            return None
        t = control.from_options(tok, window, prompt=prompt, infill=infill, edit=edit, length=length,
                                 mask_len=mask_len, label=label)
        label_index(bundle, label)                          # an unknown label fails before any work
        if t.conditional:
            check_spans(bundle)
        return itertools.repeat(t, num)

    from tdiff.errors import DataError, UsageError
    from tdiff.io import display_name, iter_jsonl

    name = display_name(input)
    label_index(bundle, label)
    if length > window:
        raise UsageError(f"--length {length}: more than the model's window of {window} tokens")

    def records():
        for n, rec in iter_jsonl(input):
            if length and "length" not in rec and "mask" not in rec:
                rec = {**rec, "length": length}
            t = control.from_record(rec, tok, window, name, n, mask_len)
            if t.label is None:
                t.label = label
            else:                                         # the record's own label is data: file:line, exit 65
                label_index(bundle, t.label, f"{name}:{n}: 'label'", DataError)
            for _ in range(num):
                yield t

    return records()


def _sample_ar(model, output, num, batch_size, length, temperature, top_k, top_p, seed, device, dtype, prompt=None):
    """`tdiff sample` on a train-ar directory: transformers `generate` with the KV cache."""
    import time

    from tdiff import control, log, memory
    from tdiff.ar import generate_ar, load_ar
    from tdiff.device import resolve_device, resolve_dtype
    from tdiff.io import JsonlWriter, open_output

    text = control.literal(prompt, "--prompt") if prompt else None
    dev = resolve_device(device)
    dtype = resolve_dtype(dtype, dev)
    m, tok = load_ar(model, dev)
    ids = tok.encode(text) if text else None
    c = m.config
    positions = min(c.n_positions, 1 + len(ids or []) + (length or c.n_positions))
    memory.check_fits([(memory.kv_cache_bytes(min(batch_size, num), positions, c.n_embd, c.n_layer, c.vocab_size),
                        "the keys and values of every position", f"--batch-size {batch_size}")], dev)
    t0 = time.perf_counter()
    ntok = 0
    with memory.out_of_memory_errors("try a smaller --batch-size"), open_output(output) as out:
        w = JsonlWriter(out, flush_every=1)
        for rec in generate_ar(m, tok, num, batch_size=batch_size, max_new_tokens=length, temperature=temperature,
                               top_k=top_k, top_p=top_p, seed=seed, device=dev, dtype=dtype, prompt=ids):
            if text:
                rec["prompt"] = text
            rec["solver"] = "ar"
            w.write(rec)
            ntok += len(rec["ids"])
    dt = time.perf_counter() - t0
    log.info(f"sample: {num} AR samples, {ntok} tokens in {dt:.2f}s ({ntok / max(dt, 1e-9):.0f} tok/s) on {dev}")
