"""Samplers for the continuous-time VP diffusion of schedules.py.

Every solver is a pure function with one signature (k-diffusion style):

    sample_<name>(denoise, x, ts, schedule, *, generator=None, callback=None, **opts) -> x0

  denoise(x_t, t) -> x0_hat   x_t of shape (B, ...), t float64 of shape (B,); returns the x0
                              estimate, same shape (the model wrapper turns x0/ε/v outputs,
                              self-conditioning and guidance into this one function).
  x                           the starting state at time ts[0] (N(0, I) noise when ts[0] = 1).
  ts                          float64 1-D grid, strictly decreasing, len = steps + 1, from
                              ``time_grid``; normally 1 → 0, but any sub-interval works
                              (e.g. SDEdit-style editing from t = 0.6, or two teacher steps in
                              progressive distillation).
  schedule                    a ``Schedule``; α, σ, λ and every coefficient are computed in
                              float64 Python floats, then combined with tensors in x's dtype.
  generator                   torch.Generator for the noise of stochastic solvers (may live on
                              another device than x: noise is drawn there and moved).
  **opts                      solver-specific keywords, explicit in each signature (ddim: eta);
                              an option a solver does not take is a TypeError.
  callback(i, t, x, x0_hat)   called once per step with the step index, the time t_i (float),
                              the state x_{t_i} fed to the denoiser and its x0 estimate.

The end point t = 0 is the data itself: α = 1, σ = 0, λ = +∞ (the schedule's clipping to
λ ≤ 15 applies to every t > 0).  A step that ends at σ = 0 therefore returns the denoiser's x0
estimate (DDPM's last step without noise, DDIM's deterministic limit, and DPM-Solver++'s
"lower_order_final" / "denoise to zero" convention).

Solvers do not switch off autograd; call them under ``torch.inference_mode()`` for sampling.
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Optional

import torch

from .schedules import Schedule

Denoiser = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Callback = Optional[Callable[[int, float, torch.Tensor, torch.Tensor], None]]

TIME_GRIDS = ("uniform", "logsnr", "warp")


def time_grid(steps: int, schedule: Optional[Schedule] = None, kind: str = "uniform", warp=None) -> torch.Tensor:
    """Decreasing float64 grid t_0 = 1 > t_1 > … > t_steps = 0 (length steps + 1).

    kind="uniform": uniform in t (the default; with the cosine schedule this is close to
    uniform in the angle, as in Nichol & Dhariwal 2021).
    kind="logsnr": uniform in λ between λ(1) and λ(0) (Lu et al. 2022, DPM-Solver §3.3 "time
    step schedule" uses uniform λ); needs ``schedule``.  The last step goes on to t = 0 (λ = ∞).
    kind="warp": uniform in the training time warp's CDF (``warp``, a
    :class:`tdiff.diffusion.timewarp.TimeWarp`): steps are dense where training found the x0
    error to change fastest (CDCD, Dieleman et al. 2022, uses its warp for sampling the same way).
    """
    try:
        n = operator.index(steps)
    except TypeError:
        n = 0
    if isinstance(steps, bool) or n < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    steps = n
    if kind == "uniform":
        return torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    if kind == "logsnr":
        if schedule is None:
            raise ValueError("time_grid(kind='logsnr') needs the schedule")
        dev = _schedule_device(schedule)
        with torch.no_grad():
            ends = schedule.log_snr(torch.tensor([1.0, 0.0], dtype=torch.float64, device=dev)).cpu()
            lams = torch.linspace(float(ends[0]), float(ends[1]), steps + 1, dtype=torch.float64)
            ts = schedule.t_from_log_snr(lams.to(dev)).cpu()
        ts[0], ts[-1] = 1.0, 0.0
        return ts
    if kind == "warp":
        if warp is None:
            raise ValueError("time_grid(kind='warp') needs the model's time warp (train with --t-sampling adaptive)")
        ts = warp.inverse(torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64))
        ts[0], ts[-1] = 1.0, 0.0
        for i in range(1, steps + 1):                    # strictly decreasing even where the density is flat
            ts[i] = min(float(ts[i]), float(ts[i - 1]) - 1e-6)
        ts[-1] = 0.0
        return ts
    raise ValueError(f"unknown time grid {kind!r}; choose one of: {', '.join(TIME_GRIDS)}")


# ----------------------------------------------------------------------------- helpers

def _schedule_device(schedule: Schedule) -> torch.device:
    p = next(schedule.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _check_grid(ts) -> list[float]:
    ts = torch.as_tensor(ts, dtype=torch.float64)
    if ts.dim() != 1 or ts.numel() < 2:
        raise ValueError(f"ts must be a 1-D time grid with at least 2 points, got shape {tuple(ts.shape)}")
    t = ts.tolist()
    if not all(a > b for a, b in zip(t, t[1:])):
        raise ValueError("ts must be strictly decreasing (from 1 towards 0)")
    if t[0] > 1.0 or t[-1] < 0.0:
        raise ValueError(f"ts must lie in [0, 1], got [{t[-1]}, {t[0]}]")
    return t


def _coefficients(schedule: Schedule, t: list[float]):
    """α_t, σ_t, λ_t as float64 Python lists; t = 0 is the data (α = 1, σ = 0, λ = ∞)."""
    dev = _schedule_device(schedule)
    with torch.no_grad():
        tt = torch.tensor(t, dtype=torch.float64, device=dev)
        a, s = schedule.alpha_sigma(tt)
        lam = schedule.log_snr(tt)
    a, s, lam = a.tolist(), s.tolist(), lam.tolist()
    for i, ti in enumerate(t):
        if ti == 0.0:
            a[i], s[i], lam[i] = 1.0, 0.0, math.inf
    return a, s, lam


def _denoise(denoise: Denoiser, x: torch.Tensor, t: float) -> torch.Tensor:
    tb = torch.full((x.shape[0],), t, dtype=torch.float64, device=x.device)
    x0 = denoise(x, tb)
    if x0.shape != x.shape:
        raise ValueError(f"denoise returned shape {tuple(x0.shape)} for input {tuple(x.shape)}")
    return x0.to(x.dtype)


def _noise_like(x: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    dev = generator.device if generator is not None else x.device
    z = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=dev)
    return z.to(x.device)


# ----------------------------------------------------------------------------- solvers

def sample_ddpm(denoise: Denoiser, x: torch.Tensor, ts, schedule: Schedule, *,
                generator: Optional[torch.Generator] = None, callback: Callback = None) -> torch.Tensor:
    """Ancestral sampling (Ho et al. 2020, "DDPM", eq. 6–7 and Algorithm 2) in continuous time
    (Kingma et al. 2021, VDM, eq. 28–32 / Appendix A).

    For each step t → s (s < t) draw x_s ~ q(x_s | x_t, x0 = x̂0(x_t)) with
        α_{t|s} = α_t / α_s,   σ²_{t|s} = σ_t² − α²_{t|s} σ_s²  = σ_t² (1 − e^{λ_t − λ_s}),
        μ = (α_{t|s} σ_s² / σ_t²) x_t + (α_s σ²_{t|s} / σ_t²) x̂0,
        Var = σ²_{t|s} σ_s² / σ_t².
    (1 − e^{λ_t − λ_s} is computed as −expm1, exact for close steps.)  At s = 0, μ = x̂0 and
    Var = 0, so the last step adds no noise.
    """
    t = _check_grid(ts)
    a, s, lam = _coefficients(schedule, t)
    for i in range(len(t) - 1):
        x0 = _denoise(denoise, x, t[i])
        if callback is not None:
            callback(i, t[i], x, x0)
        j = i + 1
        ratio = -math.expm1(lam[i] - lam[j])                    # σ²_{t|s} / σ_t²
        c_xt = (a[i] / a[j]) * (s[j] / s[i]) ** 2               # α_{t|s} σ_s² / σ_t²
        c_x0 = a[j] * ratio                                     # α_s σ²_{t|s} / σ_t²
        var = s[j] ** 2 * ratio                                 # σ²_{t|s} σ_s² / σ_t²
        x = c_xt * x + c_x0 * x0
        if var > 0.0:
            x = x + math.sqrt(var) * _noise_like(x, generator)
    return x


def sample_ddim(denoise: Denoiser, x: torch.Tensor, ts, schedule: Schedule, *,
                generator: Optional[torch.Generator] = None, callback: Callback = None,
                eta: float = 0.0) -> torch.Tensor:
    """DDIM (Song, Meng & Ermon 2021, "Denoising Diffusion Implicit Models", eq. 12 with
    σ_t(η) of eq. 16), written for continuous VP time:

        ε̂ = (x_t − α_t x̂0) / σ_t
        σ_η² = η² · σ_s² (1 − e^{λ_t − λ_s})        (= η² × the DDPM posterior variance)
        x_s = α_s x̂0 + sqrt(σ_s² − σ_η²) · ε̂ + σ_η z,   z ~ N(0, I).

    η = 0 (default) is the deterministic DDIM, a first-order solver of the probability-flow
    ODE; η = 1 gives the same distribution of steps as ``sample_ddpm``.  η must be in [0, 1].
    """
    if not 0.0 <= float(eta) <= 1.0:
        raise ValueError(f"ddim: eta must be in [0, 1], got {eta}")
    t = _check_grid(ts)
    a, s, lam = _coefficients(schedule, t)
    for i in range(len(t) - 1):
        x0 = _denoise(denoise, x, t[i])
        if callback is not None:
            callback(i, t[i], x, x0)
        j = i + 1
        eps = (x - a[i] * x0) / s[i]                                     # ε̂ (eq. 12)
        var_eta = float(eta) ** 2 * s[j] ** 2 * -math.expm1(lam[i] - lam[j])
        c_eps = math.sqrt(max(s[j] ** 2 - var_eta, 0.0))                 # "direction pointing to x_t"
        x = a[j] * x0 + c_eps * eps                                      # "predicted x0" term
        if var_eta > 0.0:
            x = x + math.sqrt(var_eta) * _noise_like(x, generator)      # "random noise"
    return x


def sample_dpm(denoise: Denoiser, x: torch.Tensor, ts, schedule: Schedule, *,
               generator: Optional[torch.Generator] = None, callback: Callback = None) -> torch.Tensor:
    """DPM-Solver++(2M): multistep second-order solver of the probability-flow ODE in data
    prediction (Lu et al. 2022, "DPM-Solver++", Algorithm 2), with λ here meaning the
    half log-SNR  λ_t = log(α_t / σ_t)  of that paper (= ½ of ``Schedule.log_snr``).

        h_i = λ_{t_i} − λ_{t_{i−1}}
        i = 1:   x̃_{t_1} = (σ_{t_1}/σ_{t_0}) x̃_{t_0} − α_{t_1} (e^{−h_1} − 1) x̂0(x̃_{t_0}, t_0)
        i ≥ 2:   r_i = h_{i−1} / h_i
                 D_i = (1 + 1/(2 r_i)) x̂0(x̃_{t_{i−1}}, t_{i−1}) − 1/(2 r_i) x̂0(x̃_{t_{i−2}}, t_{i−2})
                 x̃_{t_i} = (σ_{t_i}/σ_{t_{i−1}}) x̃_{t_{i−1}} − α_{t_i} (e^{−h_i} − 1) D_i

    The first step is first order (no history).  A step that ends at t = 0 has h = ∞, where the
    second-order correction is undefined; it is taken first order ("lower_order_final", as in
    diffusers with final_sigmas_type="zero"), which returns x̂0(x̃_{t_{N−1}}, t_{N−1}).  ``generator``
    is unused (deterministic solver).
    """
    t = _check_grid(ts)
    a, s, lam = _coefficients(schedule, t)
    x0_prev = h_prev = None
    for i in range(len(t) - 1):
        x0 = _denoise(denoise, x, t[i])
        if callback is not None:
            callback(i, t[i], x, x0)
        j = i + 1
        if s[j] == 0.0:                       # final step to the data: first order, x̃_0 = x̂0
            x = x0
            break
        h = 0.5 * (lam[j] - lam[i])
        if x0_prev is None:
            D = x0
        else:
            r = h_prev / h
            D = (1.0 + 0.5 / r) * x0 - (0.5 / r) * x0_prev
        x = (s[j] / s[i]) * x - (a[j] * math.expm1(-h)) * D
        x0_prev, h_prev = x0, h
    return x


def sample_consistency(denoise: Denoiser, x: torch.Tensor, ts, schedule: Schedule, *,
                       generator: Optional[torch.Generator] = None, callback: Callback = None) -> torch.Tensor:
    """Multistep consistency sampling (Song et al. 2023, "Consistency Models", Algorithm 1), for a
    consistency model f(x_t, t) given as ``denoise`` (it returns the trajectory's end, an x0):

        x̂0 = f(x_{t_0}, t_0)
        for i = 1 … N−1:   x_{t_i} = α_{t_i} x̂0 + σ_{t_i} z,  z ~ N(0, I);   x̂0 = f(x_{t_i}, t_i)

    With the grid 1 = t_0 > t_1 > … > t_N = 0 of N steps it makes N network calls; the end point
    t_N = 0 is never evaluated (f(x, 0) = x). N = 1 is one-step generation. In VP form the
    re-noising keeps the marginal variance: α² + σ² = 1.
    """
    t = _check_grid(ts)
    a, s, _ = _coefficients(schedule, t)
    x0 = None
    for i in range(len(t) - 1):
        if i > 0:
            x = a[i] * x0 + s[i] * _noise_like(x0, generator)
        x0 = _denoise(denoise, x, t[i])
        if callback is not None:
            callback(i, t[i], x, x0)
    return x0


SOLVERS = {"ddpm": sample_ddpm, "ddim": sample_ddim, "dpm": sample_dpm, "consistency": sample_consistency}


def get_solver(name: str):
    """The solver function for a name in SOLVERS (ValueError listing the choices otherwise)."""
    try:
        return SOLVERS[name]
    except KeyError:
        raise ValueError(f"unknown solver {name!r}; choose one of: {', '.join(SOLVERS)}") from None
