"""Adaptive timestep sampling by time warping: put training steps where tokens are decided.

With uniform t a denoiser spends most steps where its answer is trivial (low noise: the
noisy input already decodes) or hopeless (high noise: only the unconditional mean is
learnable). CDCD (Dieleman et al. 2022, "Continuous diffusion for categorical data", §3.3
"time warping") instead draws t from a density proportional to how fast the loss changes
with t, so that training steps are spread uniformly over the *loss*, not over time:

    F(t) = E[ℓ | t]  (monotone in t),   p(t) ∝ dF/dt,   t = F⁻¹(u · F(1)),  u ~ U(0, 1).

CDCD fits F to the cross-entropy; here ℓ is that too when training computes it (`train
--decoder-ce`: the frozen decoder's token cross-entropy on the x0 estimate), and otherwise the
denoiser's x0 error in the normalized latent space (mean over positions and channels: 0 for a
perfect estimate, ≈ 1 for the data mean), which every target (x0, ε, v) yields for free. F is
a histogram over BINS equal bins of t, each an exponential moving average of the losses seen
there, made monotone by isotonic regression; a share UNIFORM of the density stays uniform so no range of t is
ever starved (and the curve keeps being measured everywhere). Sampling is stratified like
:func:`tdiff.diffusion.losses.stratified_times` and inverts the piecewise-constant density.

The state is two buffers (the curve and how many batches updated each bin), so it is checkpointed with the
model it trains and stored in the artifact.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from tdiff.core.errors import require

MAX_BINS = 4096     # more bins than this is a damaged setting, not a time warp


def isotonic(y: torch.Tensor) -> torch.Tensor:
    """Least-squares non-decreasing fit to Y (n,), by pool-adjacent-violators (Barlow et al. 1972)."""
    blocks = []                                       # [mean, size]
    for v in y.tolist():
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return torch.tensor([m for m, n in blocks for _ in range(n)], dtype=y.dtype)


class TimeWarp(nn.Module):
    def __init__(self, bins: int = 64, uniform: float = 0.2, momentum: float = 0.98, warmup: int = 20):
        super().__init__()
        require(2 <= bins <= MAX_BINS, "time warp", "bins", f"must be in 2..{MAX_BINS}, got {bins}")
        require(0 < uniform <= 1, "time warp", "uniform", f"must be in (0, 1], got {uniform}")
        require(0 <= momentum < 1, "time warp", "momentum", f"must be in [0, 1), got {momentum}")
        require(warmup >= 0, "time warp", "warmup", f"must be >= 0, got {warmup}")
        self.bins, self.uniform, self.momentum, self.warmup = bins, uniform, momentum, warmup
        edges = (torch.arange(bins, dtype=torch.float64) + 1) / bins
        self.register_buffer("curve", edges)                                  # (bins,) E[ℓ | t in bin]; start: uniform
        self.register_buffer("count", torch.zeros(bins, dtype=torch.float64))  # (bins,) batches that updated each bin

    def config(self) -> dict:
        return {"bins": self.bins, "uniform": self.uniform, "momentum": self.momentum, "warmup": self.warmup}

    @torch.no_grad()
    def update(self, t: torch.Tensor, err: torch.Tensor) -> None:
        """Fold per-example errors ERR (B,) observed at times T (B,) into the curve.

        Each bin averages its first WARMUP observations exactly, then moves as an EMA."""
        idx = (t.detach().double().cpu() * self.bins).long().clamp(0, self.bins - 1)   # (B,)
        e = err.detach().double().cpu()                                                  # (B,)
        curve, count = self.curve.cpu(), self.count.cpu()
        for b in idx.unique().tolist():
            m = float(e[idx == b].mean())
            n = float(count[b]) + 1
            w = max(1.0 / n, 1.0 - self.momentum) if n <= self.warmup else 1.0 - self.momentum
            curve[b] = curve[b] + w * (m - curve[b])
            count[b] = n
        self.curve.copy_(curve)
        self.count.copy_(count)

    def density(self) -> torch.Tensor:
        """(bins,) float64 probabilities of each bin: dF/dt mixed with a UNIFORM share of U(0, 1).

        F is the isotonic (least-squares monotone) fit to the bin means, so one noisy bin does
        not put a spike of density next to a hole; the rise per bin is then smoothed over its
        two neighbours."""
        f = isotonic(self.curve.double().cpu().clamp_min(0))                                   # (bins,) monotone F
        inc = torch.diff(f, prepend=torch.zeros(1, dtype=torch.float64))                     # (bins,) F rise per bin
        padded = torch.nn.functional.pad(inc.view(1, 1, -1), (1, 1), mode="replicate")       # (1, 1, bins + 2)
        inc = torch.nn.functional.conv1d(padded, torch.full((1, 1, 3), 1 / 3, dtype=torch.float64)).view(-1)
        total = float(inc.sum())
        shaped = inc / total if total > 0 else torch.full_like(inc, 1.0 / self.bins)
        return (1 - self.uniform) * shaped + self.uniform / self.bins

    def sample(self, b: int, generator, device) -> torch.Tensor:
        """(B,) float64 times from the warped density, stratified over the batch and shuffled."""
        u = torch.rand((), generator=generator, device=device).item()
        q = (torch.arange(b, dtype=torch.float64) + u) / b                                 # (B,) stratified in [0, 1)
        t = self.inverse(q).clamp(1e-5, 1 - 1e-5).to(device)                               # (B,)
        return t[torch.randperm(b, generator=generator, device=device)]

    def inverse(self, levels: torch.Tensor) -> torch.Tensor:
        """Times at which the warped CDF reaches LEVELS (float64, in [0, 1]): t = G⁻¹(level)."""
        p = self.density()
        cdf = torch.cat([torch.zeros(1, dtype=torch.float64), p.cumsum(0)])
        cdf[-1] = 1.0
        q = levels.double().cpu().clamp(0, 1)
        k = (torch.searchsorted(cdf, q, right=True) - 1).clamp(0, self.bins - 1)
        frac = (q - cdf[k]) / p[k].clamp_min(1e-12)
        return ((k.double() + frac.clamp(0, 1)) / self.bins).clamp(0, 1)
