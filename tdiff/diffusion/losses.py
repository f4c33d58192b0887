"""The denoising loss: one definition for training and evaluation.

For clean latents x0 (B, N, D) a step draws t ~ U(0, 1) stratified across the batch,
noises x_t = α_t x0 + σ_t ε (VDM eq. 1), and regresses the network's output on its
target (x0, ε or v = α ε − σ x0; Salimans & Ho 2022, Appendix D):

    L(x0) = mean over unknown positions and channels of ‖f(x_t, t) − target‖²

Two training-time options change what the network sees:

- self-conditioning (Chen et al. 2023, "Analog Bits", §3.2): on half of the steps a first
  pass without gradient estimates x0, and the second pass gets that estimate as input;
- known spans (`cond_x`, `cond_mask` of :func:`tdiff.diffusion.spans.condition`, which the
  trainer draws for a share of the rows): the known latents go through the conditioning
  channel and replace x_t at the known positions (`spans.merge`, as sampling does), so one
  network learns prompting, infilling, editing and exact lengths. Known positions are left
  out of the loss.

Block-causal denoisers (`DiTConfig.block_size` < the window; BD3-LM, Arriola et al. 2025, eq. 7 in
latent space) draw one t per block — t is then (B, K) and α, σ are per position — and see the clean
latents of earlier blocks (`DiT.forward_blocks`); the loss is the same mean over unknown positions,
and the x0 error is also kept per block (what the time warp learns from).

The schedule is never trained through this loss (α, σ are computed without gradient):
the denoising loss alone would push every t towards low noise. A learned schedule gets
its own term from :func:`tdiff.diffusion.schedules.vdm_variance_loss`, fed by the per-example
ε error that :func:`diffusion_loss` returns when asked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .spans import merge
from .process import add_noise, pred_to_eps, pred_to_x0, target as regression_target


@dataclass
class LossTerms:
    """Per-example values of one loss evaluation; the caller reduces them."""

    mse: torch.Tensor                        # (B,) target MSE on unknown positions, float32, with graph
    t: torch.Tensor                          # (B,) float64 times the rows were noised at
    eps_error: torch.Tensor | None = None    # (B,) Σ ‖ε̂ − ε‖² on unknown positions, detached (when asked)
    x_t: torch.Tensor | None = None          # (B, N, D) the noisy input, detached (with estimates=True)
    x0_hat: torch.Tensor | None = None       # (B, N, D) the network's x0 estimate (estimates=True; graph with x0_grad)
    alpha: torch.Tensor | None = None        # (B,) float64 α_t (with estimates=True)
    unknown: torch.Tensor | None = None      # (B, N, 1) 1 where the position was noised, 0 where known (estimates=True)
    x0_error: torch.Tensor | None = None     # (B,) mean ‖x̂0 − x0‖² per channel on unknown positions, detached (estimates=True)
    x0_error_blocks: torch.Tensor | None = None   # (B, K) the same per block of a block-causal denoiser (estimates=True)


def stratified_times(b: int, generator, device) -> torch.Tensor:
    """(B,) float64 times: one uniform offset u, t_i = (i + u)/B, shuffled; clamped to [1e-5, 1 − 1e-5].

    Stratification lowers the variance of the batch loss without changing its expectation."""
    u = torch.rand((), generator=generator, device=device).item()
    t = ((torch.arange(b, device=device, dtype=torch.float64) + u) / b).clamp(1e-5, 1 - 1e-5)   # (B,)
    return t[torch.randperm(b, generator=generator, device=device)]


def diffusion_loss(dit, schedule, x0: torch.Tensor, *, target: str, generator, self_condition: bool = False,
                   cond_x: torch.Tensor | None = None, cond_mask: torch.Tensor | None = None, label=None, eps_error: bool = False, t: torch.Tensor | None = None,
                   estimates: bool = False, x0_grad: bool = False) -> LossTerms:
    """Per-example denoising loss of DIT on clean latents X0 (B, N, D) (module docstring).

    Random draws, in this order, all from GENERATOR: t (stratified; none when T (B,) is
    given), ε, the self-conditioning coin (when SELF_CONDITION). COND_X (B, N, D) and
    COND_MASK (B, N, 1) are the known spans (module docstring), or None. With EPS_ERROR the (detached) per-example ε error is returned too, for
    schedule learning; with ESTIMATES the noisy input, α_t, the network's x0 estimate (keeping
    its graph when X0_GRAD, for a loss through the VAE decoder), the unknown-position mask and
    the per-example x0 error (what :class:`tdiff.diffusion.timewarp.TimeWarp` tracks).
    """
    b, n, _ = x0.shape
    dev = x0.device
    blocks = getattr(getattr(dit, "config", None), "block_causal", False)
    k = -(-n // dit.config.block) if blocks else 1
    if t is None:
        t = stratified_times(b * k, generator, dev)                      # (B·K,) float64
    else:
        t = t.to(device=dev, dtype=torch.float64)
    if blocks:                                                           # (B, K): one time per block; a given
        t = t.reshape(b, k) if t.numel() == b * k else t.reshape(b, 1).expand(b, k)   # (B,) puts every block at it
    with torch.no_grad():
        alpha, sigma = schedule.alpha_sigma(t)                           # (B,) or (B, K) float64
    a32, s32 = alpha.float(), sigma.float()
    if blocks:
        bid = dit.block_ids(n, dev)                                      # (N,)
        a32, s32 = a32[:, bid, None], s32[:, bid, None]                  # (B, N, 1) per position
    eps = torch.randn(x0.shape, generator=generator, device=dev)         # (B, N, D)
    x_t = add_noise(x0, eps, a32, s32)                                   # (B, N, D)
    x_t = merge(x_t, cond_x, cond_mask)                                  # known positions are clean
    tt = t.float()

    def net(x, sc):
        if blocks:
            return dit.forward_blocks(x, tt, x0, self_cond=sc, label=label, cond_x=cond_x, cond_mask=cond_mask)
        return dit(x, tt, self_cond=sc, label=label, cond_x=cond_x, cond_mask=cond_mask)

    self_cond = None
    if self_condition and torch.rand((), generator=generator, device=dev).item() < 0.5:
        with torch.no_grad():
            p0 = net(x_t.detach(), None)
            self_cond = pred_to_x0(target, p0.float(), x_t.detach(), a32, s32).detach()
    pred = net(x_t, self_cond).float()                                    # (B, N, D)
    err = (pred - regression_target(target, x0, eps, a32, s32)) ** 2    # (B, N, D)
    w = (1 - cond_mask) if cond_mask is not None else torch.ones_like(err[..., :1])   # (B, N, 1) unknown
    mse = (err * w).sum((1, 2)) / (w.sum((1, 2)) * err.shape[-1]).clamp_min(1)       # (B,)
    out = LossTerms(mse=mse, t=t)
    if estimates:
        out.x_t, out.alpha, out.unknown = x_t.detach(), alpha, w
        x0_hat = pred_to_x0(target, pred if x0_grad else pred.detach(), x_t.detach(), a32, s32)   # (B, N, D)
        out.x0_hat = x0_hat
        with torch.no_grad():
            e0 = (x0_hat.detach() - x0) ** 2                             # (B, N, D)
            out.x0_error = (e0 * w).sum((1, 2)) / (w.sum((1, 2)) * e0.shape[-1]).clamp_min(1)   # (B,)
            if blocks:
                per_pos = (e0 * w).sum(2)                                # (B, N)
                num = per_pos.new_zeros(b, k).index_add_(1, bid, per_pos)            # (B, K)
                den = w[..., 0].new_zeros(b, k).index_add_(1, bid, w[..., 0]) * e0.shape[-1]   # (B, K)
                out.x0_error_blocks = num / den.clamp_min(1)             # (B, K)
    if eps_error:
        with torch.no_grad():
            e2 = (pred_to_eps(target, pred.detach(), x_t.detach(), a32, s32) - eps) ** 2   # (B, N, D)
            out.eps_error = (e2 * w).sum((1, 2))                         # (B,)
    return out


def mean_denoising_loss(dit, schedule, latents: torch.Tensor, *, target: str, generator,
                        batch_size: int = 256) -> float:
    """One pass over LATENTS (M, N, D): the mean per-example loss with fresh t and ε, no known
    spans and no self-conditioning (the number `tdiff train` and `tdiff eval` report as
    held-out denoising loss). Call under ``torch.no_grad()``."""
    total, count = 0.0, 0
    for i in range(0, len(latents), batch_size):
        x0 = latents[i:i + batch_size]
        total += float(diffusion_loss(dit, schedule, x0, target=target, generator=generator).mse.sum())
        count += len(x0)
    return total / max(1, count)


def decoder_cross_entropy(decode, x0_hat: torch.Tensor, ids: torch.Tensor, unknown: torch.Tensor,
                          pad_id: int) -> torch.Tensor:
    """Per-example token cross-entropy (B,) of a frozen decoder on the denoiser's x0 estimate.

    A token-level signal for the denoiser, alongside the latent MSE: the latent regression
    weighs every channel alike, while what matters is whether the estimate decodes to the
    right tokens (CDCD's score interpolation, Dieleman et al. 2022 §3.1, trains through a
    cross-entropy for the same reason; Diffusion-LM's rounding term, Li et al. 2022 eq. 2, is
    the x0-space analogue). DECODE maps normalized latents (B, N, D) to logits (B, L, V) with
    L = N·k; IDS (B, L) are the tokens the latents encode; UNKNOWN (B, N, 1) marks the noised
    latent positions. Counted: text tokens and the first pad (the end-of-text decision) at
    unknown positions, as the VAE's own reconstruction loss counts them.
    """
    import torch.nn.functional as F

    b, L = ids.shape
    logits = decode(x0_hat).float()                                        # (B, L, V)
    k = L // unknown.shape[1]
    lengths = (ids != pad_id).long().cumprod(1).sum(1)                     # (B,) tokens before the first pad
    counted = torch.arange(L, device=ids.device)[None, :] <= lengths[:, None]           # (B, L)
    w = counted.float() * unknown[..., 0].repeat_interleave(k, dim=1)       # (B, L)
    ce = F.cross_entropy(logits.reshape(b * L, -1), ids.reshape(b * L), reduction="none").view(b, L)
    return (ce * w).sum(1) / w.sum(1).clamp_min(1)                          # (B,)
