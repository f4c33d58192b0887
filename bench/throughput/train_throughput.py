"""Training throughput of the tiny DiT step (denoising loss, backward, AdamW) under a few
engine settings: eager (the default), a fused AdamW, torch.compile of the denoiser. Random
latents of the songci shape (batch 64, 64 positions, 32 channels); tokens/s counts the
64·64 token positions per step, as `tdiff train` logs them. Prints JSON.

Usage: python -m bench.throughput.train_throughput [--steps 40] [--threads 1] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import time

from bench.common import print_json, set_threads


def run(variant: str, steps: int, dtype: str, batch: int, n: int, d: int) -> dict:
    import torch

    from tdiff.core.device import autocast
    from tdiff.diffusion.losses import diffusion_loss
    from tdiff.diffusion.schedules import make_schedule
    from tdiff.models.dit import PRESETS, DiT, DiTConfig

    torch.manual_seed(0)
    dit = DiT(DiTConfig(**PRESETS["tiny"], latent_dim=d, max_len=n))
    net = torch.compile(dit) if variant == "compile" else dit
    opt = torch.optim.AdamW(dit.parameters(), lr=1e-4, fused=(variant == "fused") or None)
    sched = make_schedule("cosine")
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(batch, n, d)
    dev = torch.device("cpu")

    def step():
        with autocast(dev, dtype):
            loss = diffusion_loss(net, sched, x0, target="v", generator=g, self_condition=True).mse.mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dit.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(5):                                                      # warm-up (compilation included)
        step()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = time.perf_counter() - t0
    return {"variant": variant, "warmup_s": round(warm, 2), "steps": steps,
            "tokens_per_s": round(steps * batch * n / dt, 1), "step_ms": round(1000 * dt / steps, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--variants", default="eager,fused,compile")
    args = ap.parse_args()
    out = {"threads": set_threads(args.threads), "dtype": args.dtype,
           "runs": [run(v, args.steps, args.dtype, 64, 64, 32) for v in args.variants.split(",")]}
    print_json(out, indent=1)


if __name__ == "__main__":
    main()
