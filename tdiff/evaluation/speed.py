"""Speed of sampling (`tdiff eval --speed`): tokens/s and per-batch latency percentiles, after
untimed warm-up batches, for a diffusion model and for the AR baseline alike."""

from __future__ import annotations

import time

from tdiff.core.errors import UsageError
from tdiff.evaluation import metrics as M


def _sync(device):
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def _timing(times, positions_per_run, generated) -> dict:
    total = sum(times)
    lat = M.latency_percentiles(times)
    return {"tokens_per_s": positions_per_run * len(times) / total,
            "generated_tokens_per_s": generated / total,
            "latency_p50_s": lat["p50"], "latency_p95_s": lat["p95"], "latency_mean_s": lat["mean"]}


def timed_diffusion_batch(bundle, batch_size: int, opts, generator, device):
    """(seconds, ids (B, L) on the CPU) of one batch through the sampling path of `tdiff sample`:
    noise → solver → VAE decoder → token ids. The clock includes the copy to the CPU. A block-causal
    model stops where its batch's texts have ended: its L is then below the window."""
    from tdiff.sampling.sample import latents_to_ids, sample_latents

    _sync(device)
    t0 = time.perf_counter()
    z = sample_latents(bundle, batch_size, opts, generator, device)            # (B, N, D)
    ids = latents_to_ids(bundle, z, opts, generator).cpu()                     # (B, L)
    _sync(device)
    return time.perf_counter() - t0, ids


def timed_ar_batch(model, batch_size: int, length: int, device, dtype: str = "fp32"):
    """(seconds, ids (B, 1 + LENGTH) on the CPU) of one batched `generate` from [bos]: greedy, KV cache,
    exactly LENGTH new tokens (min_new_tokens = max_new_tokens), inference mode, DTYPE autocast."""
    import torch
    from transformers import GenerationConfig

    from tdiff.models.ar import quiet_transformers
    from tdiff.core.device import autocast

    c = model.config
    gconf = GenerationConfig(max_new_tokens=length, min_new_tokens=length, use_cache=True, do_sample=False,
                             bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    prompt = torch.full((batch_size, 1), c.bos_token_id, dtype=torch.long, device=device)   # (B, 1)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode(), autocast(device, dtype), quiet_transformers():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=gconf)
    out = out.cpu()                                                            # (B, 1 + length)
    _sync(device)
    return time.perf_counter() - t0, out


def speed_diffusion(bundle, device, steps: int = 12, solver: str = "dpm", batch_size: int = 1,
                    repeats: int = 5, warmup: int = 1, seed: int = 0, dtype: str = "fp32",
                    compile: bool = False) -> dict:
    """Time WARMUP untimed then REPEATS timed batches of BATCH_SIZE samples (noise → latents → ids).

    tokens/s counts every position decoded (batch × max_len per batch, or for a block-causal model the
    positions up to the block where its batch's texts ended: the work done); generated_tokens_per_s
    counts the tokens left after cutting at the predicted end of text.
    With COMPILE the networks run through torch.compile (tdiff/sampling/compiled.py); the first warm-up batch
    then includes the compiling, reported as warmup_s.
    """
    from tdiff.sampling.sample import SampleOptions, check_options, trim_ids
    from tdiff.core.seeds import generator

    _check_speed(batch_size, repeats, warmup)
    opts = SampleOptions(num=batch_size, batch_size=batch_size, steps=steps, solver=solver, seed=seed, dtype=dtype)
    check_options(opts)
    from tdiff.sampling.precision import for_sampling

    bundle = for_sampling(bundle, device, dtype, batch_size, compile)
    length = bundle.vae.config.max_len
    times, warm, generated, positions = [], [], 0, 0
    for r in range(warmup + repeats):
        g = generator(seed, r, "sample", device)
        dt, ids = timed_diffusion_batch(bundle, batch_size, opts, g, device)
        if r >= warmup:
            times.append(dt)
            positions += ids.numel()
            generated += sum(len(trim_ids(row, bundle.tokenizer)) for row in ids.tolist())
        else:
            warm.append(round(dt, 4))
    out = {"kind": "diffusion", "solver": solver, "steps": steps, "batch_size": batch_size, "length": length,
           "repeats": repeats, "warmup_batches": warmup, "warmup_s": warm, "dtype": dtype, "compile": compile,
           "device": str(device)}
    out.update(_timing(times, positions / max(len(times), 1), generated))
    return out


def speed_ar(model, tok, device, length: int = 128, batch_size: int = 1, repeats: int = 5, warmup: int = 1,
             seed: int = 0, dtype: str = "fp32") -> dict:
    """Time transformers `generate` (KV cache, greedy) producing exactly LENGTH new tokens per sequence
    (min_new_tokens = max_new_tokens) from [bos], WARMUP untimed then REPEATS timed batches."""
    import torch

    from tdiff.core.seeds import derive_seed

    _check_speed(batch_size, repeats, warmup)
    limit = model.config.n_positions - 1
    if length <= 0:
        length = min(128, limit)
    if length > limit:
        raise UsageError(f"--length {length}: at most {limit} new tokens fit this model's {limit + 1} positions")
    times, generated = [], 0
    model.eval()
    for r in range(warmup + repeats):
        torch.manual_seed(derive_seed(seed, r))
        dt, out = timed_ar_batch(model, batch_size, length, device, dtype)
        if r >= warmup:
            times.append(dt)
            generated += int(out.shape[0] * (out.shape[1] - 1))
    res = {"kind": "ar", "batch_size": batch_size, "length": length, "repeats": repeats, "warmup_batches": warmup,
           "dtype": dtype, "device": str(device)}
    res.update(_timing(times, batch_size * length, generated))
    return res


def _check_speed(batch_size, repeats, warmup):
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise UsageError("--speed needs --batch-size ≥ 1, --repeats ≥ 1 and --warmup-batches ≥ 0")
