"""The forward process and the three prediction parameterisations.

x_t = α_t x0 + σ_t ε   (α² + σ² = 1; α, σ from ``Schedule.alpha_sigma``).

Prediction kinds (what the network outputs):
  "x0"   the clean latent x0;
  "eps"  the noise ε (Ho et al. 2020);
  "v"    v = α ε − σ x0 (Salimans & Ho 2022, "Progressive Distillation", §4 and Appendix D),
         so that x0 = α x_t − σ v and ε = σ x_t + α v.

α and σ have shape (B,) (or are scalars) and broadcast against x of shape (B, L, D) or any
(B, ...) through ``expand_like``, which also casts them to x's dtype: time and coefficients are
computed in float64 (or float32), the tensors combined in the dtype of x.
"""

from __future__ import annotations

import torch

PREDICTION_KINDS = ("x0", "eps", "v")


def _check_kind(kind: str) -> None:
    if kind not in PREDICTION_KINDS:
        raise ValueError(f"unknown prediction kind {kind!r}; choose one of: {', '.join(PREDICTION_KINDS)}")


def expand_like(a, x: torch.Tensor) -> torch.Tensor:
    """Reshape per-example coefficients a (B,) to (B, 1, ..., 1) so they broadcast over x
    (B, ...), cast to x's dtype and device.  Scalars (Python or 0-d) broadcast as they are."""
    a = torch.as_tensor(a, device=x.device).to(x.dtype)
    if a.dim() == 0 or a.dim() == x.dim():
        return a
    if a.dim() != 1 or a.shape[0] != x.shape[0]:
        raise ValueError(f"expand_like: coefficients of shape {tuple(a.shape)} do not match "
                         f"a batch of shape {tuple(x.shape)}")
    return a.reshape(a.shape[0], *([1] * (x.dim() - 1)))


def add_noise(x0: torch.Tensor, eps: torch.Tensor, alpha, sigma) -> torch.Tensor:
    """x_t = α x0 + σ ε  (VDM eq. 1)."""
    return expand_like(alpha, x0) * x0 + expand_like(sigma, x0) * eps


def target(kind: str, x0: torch.Tensor, eps: torch.Tensor, alpha, sigma) -> torch.Tensor:
    """Regression target for a network that predicts ``kind``: x0, ε, or v = α ε − σ x0."""
    _check_kind(kind)
    if kind == "x0":
        return x0
    if kind == "eps":
        return eps
    return expand_like(alpha, x0) * eps - expand_like(sigma, x0) * x0


def pred_to_x0(kind: str, pred: torch.Tensor, x_t: torch.Tensor, alpha, sigma) -> torch.Tensor:
    """x0 estimate from a prediction of ``kind`` at x_t:
    x0 → itself;  ε → (x_t − σ ε̂)/α;  v → α x_t − σ v̂."""
    _check_kind(kind)
    if kind == "x0":
        return pred
    a, s = expand_like(alpha, x_t), expand_like(sigma, x_t)
    if kind == "eps":
        return (x_t - s * pred) / a
    return a * x_t - s * pred


def pred_to_eps(kind: str, pred: torch.Tensor, x_t: torch.Tensor, alpha, sigma) -> torch.Tensor:
    """ε estimate from a prediction of ``kind`` at x_t:
    x0 → (x_t − α x̂0)/σ;  ε → itself;  v → σ x_t + α v̂."""
    _check_kind(kind)
    if kind == "eps":
        return pred
    a, s = expand_like(alpha, x_t), expand_like(sigma, x_t)
    if kind == "x0":
        return (x_t - a * pred) / s
    return s * x_t + a * pred
