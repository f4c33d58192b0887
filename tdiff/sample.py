"""Generate text from a trained model.

noise (B, N, D) ─solver(steps)→ latents ─denormalize→ VAE decoder ─logits→
tokens (greedy, or temperature/top-k/top-p) ─cut where the pads begin (a run of 3)→ text.
"""

from __future__ import annotations

from dataclasses import dataclass

from tdiff.errors import UsageError


@dataclass
class SampleOptions:
    num: int = 1
    batch_size: int = 16
    steps: int = 12
    solver: str = "dpm"
    eta: float = 0.0               # ddim only
    temperature: float = 0.0       # 0: greedy decoding of the VAE logits
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "fp32"
    time_grid: str = "uniform"     # uniform | logsnr | warp (the model's training time warp)
    round_x0: bool = False         # snap each x0 estimate through the VAE (decode → encode)


def filter_logits(logits, temperature: float, top_k: int, top_p: float, generator):
    """Pick one token per position from LOGITS (..., V): argmax at temperature 0, else sampled
    from the temperature-scaled distribution restricted to the top-k and the top-p nucleus
    (Holtzman et al. 2020)."""
    import torch

    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_l, order = logits.sort(-1, descending=True)
        probs = sorted_l.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p                      # keep the smallest set reaching top_p
        sorted_l = sorted_l.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_l)
    probs = logits.softmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


END_RUN = 3   # pads in a row that end a text


def trim_ids(row, tok, end_run: int = END_RUN) -> list[int]:
    """The text's token ids in a decoded ROW: up to the first run of END_RUN pads (the predicted
    end of text) or the row's end, without special ids.

    A shorter run of pads inside the text is a misdecoded token (no training text has a pad
    inside it: pads only follow the text) and is dropped rather than taken as the end: with
    the first pad as the end, one stray pad cut a sample to half its length (measured on a
    songci model: mean 26 vs 50 characters; docs/NOTES.md)."""
    out, pads = [], 0
    for i in row:
        if i == tok.pad_id:
            pads += 1
            if pads >= end_run:
                break
            continue
        pads = 0
        if i in (tok.bos_id, tok.eos_id):
            continue
        out.append(int(i))
    return out


def check_options(opts: SampleOptions) -> None:
    from tdiff.diffusion.solvers import SOLVERS

    if opts.solver not in SOLVERS:
        raise UsageError(f"--solver {opts.solver!r}: choose one of {', '.join(SOLVERS)}")
    if opts.steps < 1:
        raise UsageError("--steps must be at least 1")
    if opts.num < 0 or opts.batch_size < 1:
        raise UsageError("--num must be ≥ 0 and --batch-size ≥ 1")
    if not 0 < opts.top_p <= 1:
        raise UsageError("--top-p must be in (0, 1]")
    from tdiff.diffusion.solvers import TIME_GRIDS

    if opts.time_grid not in TIME_GRIDS:
        raise UsageError(f"--time-grid {opts.time_grid!r}: choose one of {', '.join(TIME_GRIDS)}")


def sample_latents(bundle, b: int, opts: SampleOptions, generator, device, callback=None,
                   label=None, cond_x=None, cond_mask=None):
    """Run the solver from N(0, I) noise; returns normalized latents (B, N, D)."""
    import torch

    from tdiff.device import autocast
    from tdiff.diffusion.solvers import get_solver, time_grid

    n, d = bundle.latent_shape
    x = torch.randn((b, n, d), generator=generator, device=device)          # (B, N, D) at t = 1
    if opts.time_grid == "warp" and bundle.timewarp is None:
        raise UsageError("--time-grid warp: this model has no time warp (train it with --t-sampling adaptive)")
    ts = time_grid(opts.steps, bundle.schedule, opts.time_grid, warp=bundle.timewarp).to(device)
    kw = {"eta": opts.eta} if opts.solver == "ddim" else {}
    denoise = bundle.denoiser(label=label, cond_x=cond_x, cond_mask=cond_mask, round_x0=opts.round_x0)
    with torch.inference_mode(), autocast(device, opts.dtype):
        return get_solver(opts.solver)(denoise, x, ts, bundle.schedule, generator=generator, callback=callback,
                                       **kw)


def latents_to_ids(bundle, z, opts: SampleOptions, generator):
    """Normalized latents (B, N, D) → token ids (B, L) through the VAE decoder.

    The first position never decodes to pad, bos or eos: a text is at least one token long
    (no training text is empty; without this a sample whose first latent lands nearest the
    pad decodes to an empty string)."""
    import torch

    from tdiff.device import autocast

    tok = bundle.tokenizer
    with torch.inference_mode():
        with autocast(z.device, opts.dtype):
            logits = bundle.vae.decode(bundle.vae.denormalize(z.float())).float()   # (B, L, V)
        banned = [i for i in (tok.pad_id, tok.bos_id, tok.eos_id) if i is not None and 0 <= i < logits.shape[-1]]
        logits[:, 0, banned] = float("-inf")
        return filter_logits(logits, opts.temperature, opts.top_k, opts.top_p, generator)


def generate(bundle, opts: SampleOptions, device):
    """Yield OPTS.num records {"text", "ids", "index", "seed", "steps", "solver"}.

    Batch k draws its noise from a generator seeded with derive_seed(seed, k): the same
    seed, batch size, device and dtype give the same records, byte for byte (timing is
    the caller's to report, on stderr).
    """
    from tdiff.seeds import generator

    check_options(opts)
    tok = bundle.tokenizer
    done = 0
    k = 0
    while done < opts.num:
        b = min(opts.batch_size, opts.num - done)
        g = generator(opts.seed, k, "sample", device)
        z = sample_latents(bundle, b, opts, g, device)
        ids = latents_to_ids(bundle, z, opts, g).cpu().tolist()
        for i, row in enumerate(ids):
            kept = trim_ids(row, tok)
            yield {"text": tok.decode(kept), "ids": kept, "index": done + i, "seed": opts.seed,
                   "steps": opts.steps, "solver": opts.solver}
        done += b
        k += 1
