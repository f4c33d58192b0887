"""The equations of few-step distillation, as pure functions of tensors.

Two methods turn a trained denoiser (the teacher) into a student that samples in a few steps:

- progressive distillation (Salimans & Ho 2022, "Progressive Distillation for Fast Sampling of
  Diffusion Models", Algorithm 2): the student learns to take in one DDIM step what the teacher
  takes in two, and rounds halve the step count;
- consistency distillation (Song, Dhariwal, Chen & Sutskever 2023, "Consistency Models",
  Algorithm 2): the student maps any point of the teacher's probability-flow ODE trajectory to
  the trajectory's end, and samples in 1–4 steps (Algorithm 1, multistep consistency sampling:
  ``solvers.sample_consistency``).

Times t are per example (B,) here, unlike the solvers' scalar grids; coefficients α, σ are
float64 (B,) tensors broadcast against x (B, N, D) by ``process.expand_like``. At t = 0 the data
itself: α = 1, σ = 0.
"""

from __future__ import annotations

import torch

from .process import expand_like


def rounds(from_steps: int, to_steps: int) -> list[int]:
    """The student step counts of progressive distillation from FROM_STEPS teacher steps down to
    TO_STEPS: [from/2, from/4, …, to]. FROM_STEPS must be TO_STEPS times a power of two, > 1."""
    if to_steps < 1 or from_steps <= to_steps:
        raise ValueError(f"from_steps ({from_steps}) must be larger than to_steps ({to_steps}) ≥ 1")
    out, n = [], from_steps
    while n > to_steps:
        if n % 2:
            raise ValueError(f"from_steps ({from_steps}) must be to_steps ({to_steps}) times a power of two")
        n //= 2
        out.append(n)
    if n != to_steps:
        raise ValueError(f"from_steps ({from_steps}) must be to_steps ({to_steps}) times a power of two")
    return out


def grid_times(index: torch.Tensor, steps: int) -> torch.Tensor:
    """t_i = i / STEPS for integer INDEX (B,): the uniform time grid of `solvers.time_grid`, float64."""
    return index.to(torch.float64) / steps


def ddim_update(x_t: torch.Tensor, x0_hat: torch.Tensor, alpha_t, sigma_t, alpha_s, sigma_s) -> torch.Tensor:
    """One deterministic DDIM step t → s (Song, Meng & Ermon 2021, eq. 12 with η = 0), per example:

        x_s = α_s x̂0 + σ_s (x_t − α_t x̂0) / σ_t

    (the probability-flow ODE's first-order step; at s = 0 it returns x̂0). σ_t must be > 0."""
    at, st = expand_like(alpha_t, x_t), expand_like(sigma_t, x_t)
    as_, ss = expand_like(alpha_s, x_t), expand_like(sigma_s, x_t)
    eps = (x_t - at * x0_hat) / st                                     # (B, N, D) ε̂
    return as_ * x0_hat + ss * eps


def progressive_target(x_t: torch.Tensor, x_s: torch.Tensor, alpha_t, sigma_t, alpha_s, sigma_s) -> torch.Tensor:
    """The x0 that takes x_t to x_s in ONE deterministic DDIM step t → s (Salimans & Ho 2022,
    Algorithm 2, the target x̃ of the student):

        x̃ = (x_s − (σ_s/σ_t) x_t) / (α_s − (σ_s/σ_t) α_t)

    where x_s is where two teacher steps t → t' → s ended. At s = 0 (σ_s = 0) x̃ = x_s."""
    at, st = expand_like(alpha_t, x_t), expand_like(sigma_t, x_t)
    as_, ss = expand_like(alpha_s, x_t), expand_like(sigma_s, x_t)
    r = ss / st
    return (x_s - r * x_t) / (as_ - r * at)


def truncated_snr_weight(alpha, sigma) -> torch.Tensor:
    """max(α²/σ², 1): the "truncated SNR" weighting of the x0 error (Salimans & Ho 2022, §4, eq. 10),
    which keeps the weight of nearly pure noise (α → 0) from vanishing."""
    a = torch.as_tensor(alpha, dtype=torch.float64)
    s = torch.as_tensor(sigma, dtype=torch.float64)
    return torch.clamp(a * a / (s * s).clamp_min(1e-30), min=1.0)


def consistency_target(x_s: torch.Tensor, f_s: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The target of consistency distillation at the earlier point x_s of the trajectory: the
    (stop-gradient) student's own f(x_s, s), or x_s itself where s = 0 — the boundary condition
    f(x, 0) = x (Song et al. 2023, eq. 3–5), enforced here in the loss rather than through the
    network's output, so any prediction kind (x0, ε, v) can be distilled."""
    at_zero = expand_like((s <= 0).to(x_s.dtype), x_s)                   # (B, 1, 1)
    return at_zero * x_s + (1 - at_zero) * f_s
