"""Noise schedules for continuous-time variance-preserving diffusion, t ∈ [0, 1].

The forward process is  x_t = α_t x0 + σ_t ε,  ε ~ N(0, I),  α_t² + σ_t² = 1,
and a schedule is fully described by its log signal-to-noise ratio

    λ(t) = log(α_t² / σ_t²),   decreasing in t,

from which  α_t² = sigmoid(λ(t))  and  σ_t² = sigmoid(−λ(t))  (Kingma et al. 2021, "Variational
Diffusion Models", VDM, eq. 1–4).

Clipping. Every schedule maps t affinely onto the part [u_min, u_max] of its native time axis u
where λ lies in [logsnr_min, logsnr_max] (default [−15, +15]), so λ, α, σ and dλ/dt stay finite
and differentiable everywhere on [0, 1]: α(0)² = sigmoid(15) ≈ 1 − 3·10⁻⁷ and the prior at t = 1 is
N(0, I) up to α(1) ≈ 5.5·10⁻⁴.  Solvers treat the very end of sampling, t = 0, as the data itself
(σ = 0, λ = +∞); see solvers.py.

Schedules (``make_schedule(name, **kw)``):
  cosine   Nichol & Dhariwal 2021, continuous form:  λ(u) = −2 log tan(π u / 2).
  linear   Ho et al. 2020 linear betas in continuous time, the VP-SDE of Song et al. 2021:
           log α² = −(β0 u + (β1 − β0) u² / 2),  β0 = 0.1, β1 = 20.
  sqrt     Diffusion-LM (Li et al. 2022):  ᾱ(u) = α² = 1 − sqrt(u + s),  s = 1e-4.
  learned  cosine base with K learnable per-knot offsets of the noise rate (see LearnedSchedule).

All computations run in the dtype of t (float64 for the solvers) and are differentiable in t and
in the learned parameters.  ``log_snr_derivative(t)`` gives dλ/dt in closed form, which
``vdm_variance_loss`` uses to train the learned schedule.
"""

from __future__ import annotations

import abc
import inspect
import math

import torch
from torch import nn
from torch.nn import functional as F

from tdiff.core.errors import ConfigError, require

LOGSNR_MIN = -15.0
LOGSNR_MAX = 15.0
LOGSNR_LIMIT = 50.0   # clipping bounds beyond ±this leave float64 nothing to resolve at the ends
MAX_KNOTS = 4096      # more knots than this is a damaged setting, not a schedule


def _check_clipping(what: str, logsnr_min: float, logsnr_max: float) -> None:
    """-LOGSNR_LIMIT <= logsnr_min < logsnr_max <= LOGSNR_LIMIT (ConfigError otherwise)."""
    require(-LOGSNR_LIMIT <= logsnr_min <= LOGSNR_LIMIT, what, "logsnr_min",
            f"must be in [-{LOGSNR_LIMIT:g}, {LOGSNR_LIMIT:g}], got {logsnr_min}")
    require(logsnr_min < logsnr_max <= LOGSNR_LIMIT, what, "logsnr_max",
            f"must be in (logsnr_min, {LOGSNR_LIMIT:g}] = ({logsnr_min}, {LOGSNR_LIMIT:g}], got {logsnr_max}")


def _sigmoid(x: float) -> float:
    """Numerically stable scalar logistic function (Python float64)."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _softplus(x: float) -> float:
    """log(1 + e^x) without overflow (Python float64)."""
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _as_time(t) -> torch.Tensor:
    """Python numbers become float64 tensors; tensors pass through unchanged (dtype kept)."""
    if isinstance(t, torch.Tensor):
        return t
    return torch.tensor(t, dtype=torch.float64)


class Schedule(nn.Module, metaclass=abc.ABCMeta):
    """Base class: subclasses define ``log_snr`` and ``log_snr_derivative`` and ``config``.

    Everything else (α, σ, inverse, regularizer) is derived here.
    """

    name = "base"

    @abc.abstractmethod
    def log_snr(self, t: torch.Tensor) -> torch.Tensor:
        """λ(t) = log(α_t²/σ_t²), elementwise, same shape and dtype as t."""

    def log_snr_derivative(self, t: torch.Tensor) -> torch.Tensor:
        """dλ/dt (negative), elementwise.  Default: autograd (subclasses give closed forms).

        The result keeps the graph to any learned parameters (``create_graph=True``).
        """
        t = _as_time(t).detach().requires_grad_(True)
        with torch.enable_grad():
            lam = self.log_snr(t)
            (d,) = torch.autograd.grad(lam.sum(), t, create_graph=True)
        return d

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.log_snr(_as_time(t))

    def alpha_sigma(self, t) -> tuple[torch.Tensor, torch.Tensor]:
        """(α_t, σ_t) with α = sqrt(sigmoid(λ)), σ = sqrt(sigmoid(−λ)), via log-sigmoid.

        exp(½·logsigmoid(±λ)) never overflows and keeps full relative precision for the
        small one of the two (σ near t = 0, α near t = 1).
        """
        lam = self.log_snr(_as_time(t))
        return torch.exp(0.5 * F.logsigmoid(lam)), torch.exp(0.5 * F.logsigmoid(-lam))

    def regularizer(self) -> torch.Tensor:
        """Penalty to add to the training loss; 0 for fixed schedules."""
        p = next(self.parameters(), None)
        return torch.zeros((), device=p.device if p is not None else None)

    @abc.abstractmethod
    def config(self) -> dict:
        """Keyword arguments such that ``make_schedule(**config)`` rebuilds this schedule."""

    @torch.no_grad()
    def check(self) -> None:
        """ConfigError unless λ is finite at t = 0 and t = 1 and falls from one to the other (a
        schedule built from damaged settings or learned parameters fails here, not mid-sampling)."""
        ends = self.log_snr(torch.tensor([0.0, 1.0], dtype=torch.float64))
        lam0, lam1 = float(ends[0]), float(ends[1])
        require(math.isfinite(lam0) and math.isfinite(lam1) and lam0 > lam1, f"{self.name} schedule", "",
                f"is degenerate: log-SNR {lam0:g} at t = 0 and {lam1:g} at t = 1 (need finite, falling)")

    @torch.no_grad()
    def t_from_log_snr(self, lam: torch.Tensor, iters: int = 64) -> torch.Tensor:
        """Inverse of λ(t) by bisection on [0, 1] (float64; λ is monotone).

        Values outside [λ(1), λ(0)] map to the nearest end, 1 or 0.
        """
        lam = _as_time(lam).to(torch.float64)
        lo = torch.zeros_like(lam)
        hi = torch.ones_like(lam)
        for _ in range(iters):
            mid = 0.5 * (lo + hi)
            right = self.log_snr(mid) > lam  # λ decreasing: the answer lies right of mid
            lo = torch.where(right, mid, lo)
            hi = torch.where(right, hi, mid)
        return 0.5 * (lo + hi)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config().items() if k != "name")


class CosineSchedule(Schedule):
    """Cosine schedule of Nichol & Dhariwal 2021 ("Improved DDPM", eq. 17), continuous form.

    ᾱ(u) = cos²(π u / 2)  ⇒  λ(u) = log(cot²(π u / 2)) = −2 log tan(π u / 2),  u ∈ (0, 1).

    λ → ±∞ at u = 0, 1, so t is mapped to the angle θ = θ_min + t (θ_max − θ_min) with
    θ_min = arctan(exp(−logsnr_max / 2)), θ_max = arctan(exp(−logsnr_min / 2)), giving
    λ(t) = −2 log tan θ(t) ∈ [logsnr_min, logsnr_max] exactly at the ends (as in VDM and
    "simple diffusion", Hoogeboom et al. 2023).  dλ/dt = −4 (θ_max − θ_min) / sin 2θ.
    """

    name = "cosine"

    def __init__(self, logsnr_min: float = LOGSNR_MIN, logsnr_max: float = LOGSNR_MAX):
        super().__init__()
        _check_clipping(f"{self.name} schedule", logsnr_min, logsnr_max)
        self.logsnr_min = float(logsnr_min)
        self.logsnr_max = float(logsnr_max)
        self.theta_min = math.atan(math.exp(-0.5 * self.logsnr_max))
        self.theta_max = math.atan(math.exp(-0.5 * self.logsnr_min))

    def _theta(self, t: torch.Tensor) -> torch.Tensor:
        return self.theta_min + t * (self.theta_max - self.theta_min)

    def log_snr(self, t):
        t = _as_time(t)
        theta = self._theta(t)
        # −2 log tan θ, written with sin and cos: ONNX Runtime has no float64 Tan (`tdiff export --format onnx`)
        return -2.0 * (torch.log(torch.sin(theta)) - torch.log(torch.cos(theta)))

    def log_snr_derivative(self, t):
        t = _as_time(t)
        return -4.0 * (self.theta_max - self.theta_min) / torch.sin(2.0 * self._theta(t))

    def config(self):
        return {"name": self.name, "logsnr_min": self.logsnr_min, "logsnr_max": self.logsnr_max}


class LinearSchedule(Schedule):
    """Linear-beta schedule (Ho et al. 2020) in continuous time: the VP-SDE of Song et al. 2021
    ("Score-Based Generative Modeling through SDEs", eq. 11 and Appendix B).

    β(u) = β0 + (β1 − β0) u,  γ(u) = ∫0^u β = β0 u + (β1 − β0) u² / 2,  log α² = −γ,
    λ(u) = log(α² / σ²) = −log(e^γ − 1) = −log expm1(γ).

    λ(0) = +∞, so u ∈ [u_min, u_max] with γ(u_min) = softplus(−logsnr_max) (u_min ≈ 3·10⁻⁶ for
    λ_max = 15, the ε of Song et al.) and u_max = 1 unless λ(1) < logsnr_min (λ(1) ≈ −10.05 for
    the defaults, so the prior at t = 1 has α ≈ 6.6·10⁻³).
    """

    name = "linear"

    def __init__(self, beta0: float = 0.1, beta1: float = 20.0, logsnr_min: float = LOGSNR_MIN,
                 logsnr_max: float = LOGSNR_MAX):
        super().__init__()
        require(beta0 > 0, "linear schedule", "beta0", f"must be > 0, got {beta0}")
        require(beta1 >= beta0, "linear schedule", "beta1", f"must be >= beta0 ({beta0}), got {beta1}")
        _check_clipping("linear schedule", logsnr_min, logsnr_max)
        self.beta0, self.beta1 = float(beta0), float(beta1)
        self.logsnr_min, self.logsnr_max = float(logsnr_min), float(logsnr_max)
        self.u_min = self._u_of_gamma(_softplus(-self.logsnr_max))
        self.u_max = min(1.0, self._u_of_gamma(_softplus(-self.logsnr_min)))

    def _u_of_gamma(self, g: float) -> float:
        # root of (β1−β0)/2 u² + β0 u − g = 0, written without cancellation
        a = self.beta1 - self.beta0
        return 2.0 * g / (self.beta0 + math.sqrt(self.beta0 ** 2 + 2.0 * a * g))

    def _u(self, t):
        return self.u_min + t * (self.u_max - self.u_min)

    def _gamma(self, u):
        return self.beta0 * u + 0.5 * (self.beta1 - self.beta0) * u * u

    def log_snr(self, t):
        t = _as_time(t)
        return -torch.log(torch.expm1(self._gamma(self._u(t))))

    def log_snr_derivative(self, t):
        # dλ/du = −γ'(u) e^γ / (e^γ − 1) = −β(u) / (1 − e^{−γ});  du/dt = u_max − u_min
        t = _as_time(t)
        u = self._u(t)
        beta = self.beta0 + (self.beta1 - self.beta0) * u
        return -beta / (-torch.expm1(-self._gamma(u))) * (self.u_max - self.u_min)

    def config(self):
        return {"name": self.name, "beta0": self.beta0, "beta1": self.beta1,
                "logsnr_min": self.logsnr_min, "logsnr_max": self.logsnr_max}


class SqrtSchedule(Schedule):
    """Square-root schedule of Diffusion-LM (Li et al. 2022, "Diffusion-LM Improves Controllable
    Text Generation", §4.2):  ᾱ(u) = α² = 1 − sqrt(u + s),  s = 1e-4.

    With r = sqrt(u + s):  λ(u) = log((1 − r) / r).  The noise rises fast at the start (λ(0) =
    log(0.99/0.01) ≈ 4.6: the paper's intent, so embeddings are noised early) and ᾱ would turn
    negative near u = 1, so u is clipped to u_max = sigmoid(−logsnr_min)² − s where λ = logsnr_min.
    1 − r is computed as (1 − u − s)/(1 + r) with 1 − u − s = c + (1 − t)(u_max − u_min), which
    stays accurate in float32 near t = 1.
    """

    name = "sqrt"

    def __init__(self, s: float = 1e-4, logsnr_min: float = LOGSNR_MIN, logsnr_max: float = LOGSNR_MAX):
        super().__init__()
        require(0 < s < 1, "sqrt schedule", "s", f"must be in (0, 1), got {s}")
        _check_clipping("sqrt schedule", logsnr_min, logsnr_max)
        self.s = float(s)
        self.logsnr_min, self.logsnr_max = float(logsnr_min), float(logsnr_max)
        # u at which λ = L:  1 − sqrt(u + s) = sigmoid(L)  ⇔  u = sigmoid(−L)² − s
        self.u_min = max(0.0, _sigmoid(-self.logsnr_max) ** 2 - self.s)
        q = _sigmoid(-self.logsnr_min)
        if q ** 2 - self.s < 1.0:
            self.u_max = q ** 2 - self.s
            self._c = _sigmoid(self.logsnr_min) * (1.0 + q)  # 1 − s − u_max = 1 − q², exactly
        else:
            self.u_max = 1.0
            self._c = -self.s

    def _parts(self, t):
        b = self.u_max - self.u_min
        ups = (self.u_min + self.s) + t * b           # u + s = r²
        one_minus_ups = self._c + (1.0 - t) * b       # 1 − u − s
        return ups, one_minus_ups, b

    def log_snr(self, t):
        t = _as_time(t)
        ups, omu, _ = self._parts(t)
        r = torch.sqrt(ups)
        # log(1 − r) − log r,  1 − r = (1 − r²)/(1 + r)
        return torch.log(omu) - torch.log1p(r) - 0.5 * torch.log(ups)

    def log_snr_derivative(self, t):
        # dλ/du = −1 / (2 r² (1 − r));  du/dt = u_max − u_min
        t = _as_time(t)
        ups, omu, b = self._parts(t)
        r = torch.sqrt(ups)
        one_minus_r = omu / (1.0 + r)
        return -b / (2.0 * ups * one_minus_r)

    def config(self):
        return {"name": self.name, "s": self.s, "logsnr_min": self.logsnr_min, "logsnr_max": self.logsnr_max}


class LearnedSchedule(CosineSchedule):
    """Cosine schedule with learnable per-knot offsets of the noise rate.

    Seed idea ("LearnableCosineScheduler"): β_t = β_t⁰ · (1 + δ_t) with δ_t initialised at 0,
    limited to [−0.3, 0.3], and a smoothness penalty λ_smooth · Σ_k |δ_{k+1} − δ_k|.

    Parametrisation.  K knots s_k = k / (K − 1) carry δ_k = 0.3 · tanh(raw_k) ∈ (−0.3, 0.3)
    (raw initialised at 0, so the schedule starts as the cosine one); δ(s) is piecewise linear
    between knots.  Scaling the noise rate by (1 + δ) is a change of clock: the schedule is the
    cosine one run on the warped time

        τ(t) = F(t) / F(1),   F(t) = ∫0^t (1 + δ(s)) ds,      λ(t) = λ_cosine(τ(t)),

    so its noise rate is β_cos(τ(t)) · (1 + δ(t)) / F(1) — the seed's β⁰·(1 + δ) up to the
    normalisation 1/F(1), which pins the endpoints: τ(0) = 0 and τ(1) = 1 exactly, hence λ(0),
    λ(1) and the prior at t = 1 equal the cosine schedule's.  1 + δ ≥ 0.7 > 0 makes τ strictly
    increasing.  F is closed form (the integral of a piecewise-linear function), so λ is
    differentiable in t and in raw:  dλ/dt = λ_cos'(τ) · (1 + δ(t)) / F(1).

    Training signal: see ``vdm_variance_loss``.  The denoising loss itself must NOT train δ
    (compute α, σ for the network's input with ``.detach()`` or under ``no_grad``): the plain
    denoising loss is minimised by moving every t towards low noise, which would drive δ to its
    bounds.
    """

    name = "learned"
    DELTA_MAX = 0.3

    def __init__(self, knots: int = 16, smooth: float = 1e-3, logsnr_min: float = LOGSNR_MIN,
                 logsnr_max: float = LOGSNR_MAX):
        super().__init__(logsnr_min, logsnr_max)
        require(2 <= int(knots) <= MAX_KNOTS, "learned schedule", "knots", f"must be in 2..{MAX_KNOTS}, got {knots}")
        require(smooth >= 0, "learned schedule", "smooth", f"must be >= 0, got {smooth}")
        self.knots = int(knots)
        self.smooth = float(smooth)
        self.raw_delta = nn.Parameter(torch.zeros(self.knots))

    def delta(self) -> torch.Tensor:
        """Per-knot offsets δ_k = 0.3 · tanh(raw_k), shape (K,)."""
        return self.DELTA_MAX * torch.tanh(self.raw_delta)

    def _integral(self, t: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(F(t), 1 + δ(t)) for the piecewise-linear δ through the knots."""
        K = self.knots
        h = 1.0 / (K - 1)
        # ∫ over whole segments: C_k = Σ_{j<k} h (δ_j + δ_{j+1}) / 2,  shape (K−1,)
        seg = 0.5 * h * (delta[:-1] + delta[1:])
        cum = torch.cat([seg.new_zeros(1), torch.cumsum(seg, 0)[:-1]])
        flat = t.reshape(-1)
        k = torch.clamp(torch.floor(flat.detach() * (K - 1)), 0, K - 2).long()
        w = flat - k.to(flat.dtype) * h                    # position inside segment k, in [0, h]
        d0, d1 = delta[k], delta[k + 1]
        slope = (d1 - d0) / h
        # ∫_{s_k}^{s_k + w} δ = δ_k w + slope w² / 2
        F_t = flat + cum[k] + d0 * w + 0.5 * slope * w * w
        rate = 1.0 + d0 + slope * w
        return F_t.reshape(t.shape), rate.reshape(t.shape)

    def warp(self, t) -> torch.Tensor:
        """τ(t) = F(t)/F(1) ∈ [0, 1], increasing, τ(0) = 0, τ(1) = 1."""
        return self._warp(_as_time(t))[0]

    def _warp(self, t):
        delta = self.delta().to(t.dtype)
        F_t, rate = self._integral(t, delta)
        F_1, _ = self._integral(torch.ones(1, dtype=t.dtype, device=t.device), delta)
        return F_t / F_1, rate / F_1

    def log_snr(self, t):
        t = _as_time(t)
        tau, _ = self._warp(t)
        return super().log_snr(tau)

    def log_snr_derivative(self, t):
        t = _as_time(t)
        tau, dtau = self._warp(t)
        return super().log_snr_derivative(tau) * dtau

    def regularizer(self) -> torch.Tensor:
        """λ_smooth · Σ_k |δ_{k+1} − δ_k| (the seed's smoothness penalty)."""
        d = self.delta()
        return self.smooth * (d[1:] - d[:-1]).abs().sum()

    def config(self):
        return {"name": self.name, "knots": self.knots, "smooth": self.smooth,
                "logsnr_min": self.logsnr_min, "logsnr_max": self.logsnr_max}


SCHEDULES: dict[str, type[Schedule]] = {
    "cosine": CosineSchedule,
    "linear": LinearSchedule,
    "sqrt": SqrtSchedule,
    "learned": LearnedSchedule,
}


def make_schedule(name: str = "cosine", **kw) -> Schedule:
    """Build a schedule by name; ``make_schedule(**s.config())`` rebuilds ``s`` (learned
    parameters come back with ``load_state_dict``).  Unknown names or keys are errors."""
    require(isinstance(name, str) and name in SCHEDULES, "noise schedule", "name",
            f"names an unknown schedule {name!r} (known: {', '.join(SCHEDULES)})")
    allowed = [p for p in inspect.signature(SCHEDULES[name].__init__).parameters if p != "self"]
    for key in kw:
        require(key in allowed, f"{name} schedule", key, f"is an unknown option (allowed: {', '.join(allowed)})")
    try:
        schedule = SCHEDULES[name](**kw)
    except (OverflowError, ZeroDivisionError) as e:
        raise ConfigError(f"{name} schedule", "", f"cannot be computed with these settings ({e})") from None
    schedule.check()
    return schedule


def vdm_variance_loss(schedule: Schedule, t: torch.Tensor, eps_mse_per_example: torch.Tensor) -> torch.Tensor:
    """Loss that trains a schedule's parameters to minimise the variance of the continuous-time
    ELBO estimator (VDM, Kingma et al. 2021, §5.3 and Appendix I.2).

    With t ~ U(0, 1), the diffusion term of the ELBO is estimated per example by
        L_t = −½ λ'(t) · m_t,    m_t = ||ε − ε̂(x_t; t)||²,
    whose mean does not depend on the schedule between its fixed endpoints, but whose variance
    does.  Sampling t uniformly is sampling λ with density p(λ) ∝ 1/|λ'|, and
    E[L_t²] = ¼ ∫ m(λ)² / p(λ) dλ is smallest for p(λ) ∝ m(λ), i.e. |λ'(t)| · m(t) = const.

    This function returns the surrogate  J = ¼ · mean(λ'(t)² · m_t) / (λ(0) − λ(1))²  with m_t
    DETACHED, so the gradient flows only into the schedule (through λ'(t)), never into the
    network.  Why not the literal mean(L_t²) with m detached: its stationary point is
    |λ'| ∝ 1/m², not the variance minimum.  J's gradient (as a function of λ(·)) is the exact
    gradient of E[L_t²] divided pointwise by m_t > 0, so it is a descent direction for the
    variance with the same stationary point |λ'| · m = const.  It cannot degenerate: the
    endpoints are pinned (∫0^1 λ' dt = λ(1) − λ(0) is fixed), δ ∈ [−0.3, 0.3], and the optimum
    is an interior schedule (tests/diffusion/test_schedules.py shows the literal form pushing δ to ±0.3
    and raising the variance where this one lowers it).  The division by (λ(0) − λ(1))² only
    fixes the scale (J = ¼·mean(m) for a schedule linear in λ) so that ``regularizer()`` keeps
    a sensible relative weight.  Note that the cosine base has |λ'| ~ 10³ near t = 0 and 1, so
    for realistic ε-MSE curves the optimum often sits at the δ bounds near the ends: that is
    the constraint [−0.3, 0.3] at work, not a collapse.

    Args:
      schedule: the schedule (its ``log_snr_derivative`` must carry the parameters' graph).
      t: (B,) times at which the examples were noised.
      eps_mse_per_example: (B,) ||ε − ε̂||² per example (sum or mean over elements; convert x0
        or v predictions with ``process.pred_to_eps``).  Detached here.
    Returns:
      a scalar; the trainer adds ``w · vdm_variance_loss(...) + schedule.regularizer()``.
      For a fixed schedule the result has no gradient and can be skipped.
    """
    m = eps_mse_per_example.detach().reshape(-1)
    dtype = torch.promote_types(m.dtype, torch.float32) if m.is_floating_point() else torch.float32
    m = m.to(dtype)
    t = _as_time(t).detach().reshape(-1).to(dtype)
    dlam = schedule.log_snr_derivative(t)
    with torch.no_grad():
        ends = schedule.log_snr(torch.tensor([0.0, 1.0], dtype=torch.float64, device=t.device))
        span = float(ends[0] - ends[1])
    return 0.25 * (dlam.pow(2) * m).mean() / span ** 2
