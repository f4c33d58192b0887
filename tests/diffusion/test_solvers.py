"""Solvers against data whose exact denoiser is known in closed form.

Gaussian data x0 ~ N(μ, s²) per element:
    E[x0 | x_t] = μ + α s² / (α² s² + σ²) · (x_t − α μ),
and the probability-flow ODE maps x_1 to  x0 = μ + s (x_1 − α_1 μ) / sqrt(α_1² s² + σ_1²)
exactly, so the error of a deterministic solver is measurable to machine precision.
A two-component 1-D Gaussian mixture gives a nonlinear exact denoiser (posterior mean in closed
form) for the stochastic and regression tests.
"""

from __future__ import annotations

import math

import pytest
import torch

from tdiff.diffusion import (
    PREDICTION_KINDS,
    SOLVERS,
    add_noise,
    expand_like,
    get_solver,
    make_schedule,
    pred_to_eps,
    pred_to_x0,
    sample_ddim,
    sample_ddpm,
    sample_dpm,
    target,
    time_grid,
)

torch.set_num_threads(1)
F64 = torch.float64
MU, SD = 0.7, 0.5


# ----------------------------------------------------------------------------- closed-form data

def gaussian_denoiser(schedule, mu=MU, sd=SD):
    def denoise(x, t):
        assert t.dtype == F64 and t.shape == (x.shape[0],)
        a, s = schedule.alpha_sigma(t)
        a, s = expand_like(a, x), expand_like(s, x)
        return mu + a * sd ** 2 / (a * a * sd ** 2 + s * s) * (x - a * mu)
    return denoise


def gaussian_flow_limit(schedule, x1, mu=MU, sd=SD):
    """Exact probability-flow ODE solution at t = 0 (σ = 0) from x1 at t = 1."""
    a1, s1 = (v.item() for v in schedule.alpha_sigma(torch.tensor(1.0, dtype=F64)))
    return mu + sd * (x1 - a1 * mu) / math.sqrt(a1 ** 2 * sd ** 2 + s1 ** 2)


MIX_W, MIX_M, MIX_S = (0.3, 0.7), (-2.0, 2.0), (0.5, 0.5)


def mixture_denoiser(schedule, w=MIX_W, m=MIX_M, sd=MIX_S):
    """Posterior mean of x0 under Σ_k w_k N(m_k, s_k²), elementwise."""
    def denoise(x, t):
        a, s = schedule.alpha_sigma(t)
        a, s = expand_like(a, x), expand_like(s, x)
        logits, means = [], []
        for wk, mk, sk in zip(w, m, sd):
            var = a * a * sk ** 2 + s * s
            logits.append(math.log(wk) - 0.5 * torch.log(var) - (x - a * mk) ** 2 / (2 * var))
            means.append(mk + a * sk ** 2 / var * (x - a * mk))
        r = torch.softmax(torch.stack(logits), dim=0)
        return (r * torch.stack(means)).sum(0)
    return denoise


def _x1(shape=(4, 8, 4), seed=0, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def flow_errors(name, steps, grid="uniform", schedule=None):
    sch = schedule or make_schedule("cosine")
    x1 = _x1()
    exact = gaussian_flow_limit(sch, x1)
    den = gaussian_denoiser(sch)
    return [(get_solver(name)(den, x1, time_grid(n, sch, grid), sch) - exact).abs().max().item() for n in steps]


# ----------------------------------------------------------------------------- convergence

STEPS = [4, 8, 16, 32, 64]


@pytest.mark.parametrize("name,grid", [("ddim", "uniform"), ("ddim", "logsnr"), ("dpm", "logsnr")])
def test_flow_solvers_converge_monotonically(name, grid):
    errs = flow_errors(name, STEPS, grid)
    assert all(b < a for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < (0.1 if name == "ddim" else 0.01), errs


def test_dpm_beats_ddim_on_uniform_grid():
    # On the uniform-t grid DPM-Solver++(2M)'s error changes sign between 16 and 32 steps for
    # this Gaussian (4.8e-3, then 8.8e-3), so it is not monotone there; it is always below DDIM's.
    dpm, ddim = flow_errors("dpm", STEPS), flow_errors("ddim", STEPS)
    assert all(a < b for a, b in zip(dpm, ddim)), (dpm, ddim)
    assert dpm[-1] < 0.01


def test_convergence_orders():
    """Error ratios when the steps double, on the grid uniform in log-SNR, steps 32 → 64 → 128.

    Measured (max abs error, cosine schedule):
      ddim  1.74e-1, 8.95e-2, 4.54e-2   ratios 1.94, 1.97   (first order: 2)
      dpm   1.99e-2, 5.30e-3, 1.34e-3   ratios 3.74, 3.95   (second order: 4; 4.00 at 128 → 256)
    On the uniform-t grid the early λ-steps near t = 1 do not shrink with N (λ ≈ 2 log(k/N)), which
    makes DPM-Solver++(2M) O(log N / N²) there: ratios only ~3.2 at 128 → 256.
    """
    steps = [32, 64, 128]
    ddim = flow_errors("ddim", steps, "logsnr")
    dpm = flow_errors("dpm", steps, "logsnr")
    for a, b in zip(ddim, ddim[1:]):
        assert 1.8 < a / b < 2.2, ddim
    for a, b in zip(dpm, dpm[1:]):
        assert 3.0 < a / b < 5.0, dpm


@pytest.mark.parametrize("name", ["cosine", "linear", "sqrt", "learned"])
def test_dpm_converges_for_every_schedule(name):
    sch = make_schedule(name)
    if name == "learned":
        with torch.no_grad():
            sch.raw_delta.copy_(torch.linspace(-1.5, 1.5, sch.knots))
    x1 = _x1((2, 3, 4))
    den = gaussian_denoiser(sch)
    # Limit as steps → ∞: the ODE solution at t = 0 (λ(0) = 15, or 4.6 for sqrt) denoised once.
    t0 = torch.zeros(x1.shape[0], dtype=F64)
    a0, s0 = (v[0].item() for v in sch.alpha_sigma(t0))
    a1, s1 = (v.item() for v in sch.alpha_sigma(torch.tensor(1.0, dtype=F64)))
    z = (x1 - a1 * MU) / math.sqrt(a1 ** 2 * SD ** 2 + s1 ** 2)
    limit = den(a0 * MU + math.sqrt(a0 ** 2 * SD ** 2 + s0 ** 2) * z, t0)
    errs = [(sample_dpm(den, x1, time_grid(n, sch, "logsnr"), sch) - limit).abs().max().item() for n in (32, 64)]
    assert errs[1] < errs[0] and errs[1] < 0.01, errs


# ----------------------------------------------------------------------------- stochastic solvers

def test_ddpm_matches_gaussian_moments():
    sch = make_schedule("cosine")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20000, 1, generator=g, dtype=F64)
    out = sample_ddpm(gaussian_denoiser(sch), x, time_grid(1000), sch, generator=g)
    # Standard errors: mean 0.5/sqrt(2e4) = 0.0035, variance 0.25·sqrt(2/2e4) = 0.0025.
    # Plugging E[x0|x_t] into the posterior drops Var[x0|x_t], a first-order bias of the
    # variance measured on 2e6 samples: −0.031 at 50 steps, −0.009 at 200, about −0.002 at 1000.
    assert abs(out.mean().item() - MU) < 0.015
    assert abs(out.var().item() - SD ** 2) < 0.012


@pytest.mark.parametrize("solver,opts", [("ddpm", {}), ("ddim", {"eta": 0.5}), ("dpm", {})])
def test_mixture_weights(solver, opts):
    sch = make_schedule("cosine")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(20000, 1, generator=g, dtype=F64)
    steps = 200 if solver == "ddpm" else 50
    out = get_solver(solver)(mixture_denoiser(sch), x, time_grid(steps), sch, generator=g, **opts)
    frac_right = (out > 0).double().mean().item()
    assert abs(frac_right - MIX_W[1]) < 0.02          # standard error 0.0032
    right = out[out > 0]
    assert abs(right.mean().item() - MIX_M[1]) < 0.03
    assert abs(right.std().item() - MIX_S[1]) < 0.03


def test_ddim_eta1_equals_ddpm():
    sch = make_schedule("cosine")
    den = mixture_denoiser(sch)
    x = _x1((3, 5, 2))
    ts = time_grid(7)
    a = sample_ddpm(den, x, ts, sch, generator=torch.Generator().manual_seed(5))
    b = sample_ddim(den, x, ts, sch, generator=torch.Generator().manual_seed(5), eta=1.0)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_ddim_is_deterministic_and_first_step_of_dpm():
    sch = make_schedule("cosine")
    den = mixture_denoiser(sch)
    x = _x1((2, 3, 2))
    ts = torch.tensor([1.0, 0.6], dtype=F64)   # one step: DPM-Solver++ first order = DDIM
    torch.testing.assert_close(sample_ddim(den, x, ts, sch), sample_dpm(den, x, ts, sch), rtol=0, atol=1e-12)
    ts = time_grid(6)
    torch.testing.assert_close(sample_ddim(den, x, ts, sch), sample_ddim(den, x, ts, sch), rtol=0, atol=0)


# ----------------------------------------------------------------------------- regression numbers

def _pinned_run(solver, **opts):
    sch = make_schedule("cosine")
    x = _x1((2, 2, 2), seed=1234)
    grid = opts.pop("grid", "uniform")
    g = torch.Generator().manual_seed(0)
    return get_solver(solver)(mixture_denoiser(sch), x, time_grid(5, sch, grid), sch, generator=g, **opts).reshape(-1).tolist()


PINNED = {
    "ddpm": ([1.8866161186, 1.8783012629, -2.5590033848, 1.5192391968,
              -1.8375793930, 1.7184823759, 1.8972984543, 1.8974429145], {}),
    "ddim": ([1.7064620770, 1.9047882465, -1.6055864001, 1.8073203550,
              0.6914480689, 1.9543015543, 1.8151694800, 2.0422426543], {}),
    "ddim_eta": ([1.9056283034, 1.9229126449, -2.5166867771, 1.6875148882,
                  -1.8085324393, 1.8829838329, 1.8982367899, 2.1199319786], {"eta": 0.5}),
    "dpm": ([1.7929236973, 1.9678292177, -1.8622125465, 1.8795431922,
             0.5141616799, 2.0142185850, 1.8864920904, 2.0987881534], {}),
    "dpm_logsnr": ([1.3026664730, 1.7069468380, -1.0816635614, 1.5023896451,
                    0.3724565839, 1.8127959503, 1.5185409529, 2.0003499775], {"grid": "logsnr"}),
}


@pytest.mark.parametrize("key", list(PINNED))
def test_pinned_numbers(key):
    expected, opts = PINNED[key]
    got = _pinned_run(key.split("_")[0], **opts)
    assert got == pytest.approx(expected, abs=1e-6)


# ----------------------------------------------------------------------------- interface

@pytest.mark.parametrize("name", list(SOLVERS))
def test_signature_dtype_callback(name):
    sch = make_schedule("cosine")
    den64 = mixture_denoiser(sch)
    seen = []

    def den(x, t):
        assert x.dtype == torch.float32 and t.dtype == F64 and t.shape == (x.shape[0],)
        return den64(x.double(), t).float()

    x = torch.randn(3, 4, 2)
    out = SOLVERS[name](den, x, time_grid(4), sch, generator=torch.Generator().manual_seed(0),
                        callback=lambda i, t, xt, x0: seen.append((i, t, xt.shape, x0.shape)))
    assert out.dtype == torch.float32 and out.shape == x.shape and torch.isfinite(out).all()
    assert [s[0] for s in seen] == [0, 1, 2, 3]
    assert [s[1] for s in seen] == pytest.approx([1.0, 0.75, 0.5, 0.25])
    assert all(s[2] == x.shape and s[3] == x.shape for s in seen)


@pytest.mark.parametrize("name", list(SOLVERS))
def test_one_step_returns_denoiser_output(name):
    sch = make_schedule("cosine")
    den = mixture_denoiser(sch)
    x = _x1((2, 3, 2))
    out = SOLVERS[name](den, x, time_grid(1), sch, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, den(x, torch.ones(2, dtype=F64)), rtol=0, atol=0)


def test_partial_grid_stays_at_noise_level():
    # SDEdit-style: from t = 0.5 down to t = 0.2, the state keeps the marginal at t = 0.2.
    sch = make_schedule("cosine")
    g = torch.Generator().manual_seed(3)
    a5, s5 = (v.item() for v in sch.alpha_sigma(torch.tensor(0.5, dtype=F64)))
    a2, s2 = (v.item() for v in sch.alpha_sigma(torch.tensor(0.2, dtype=F64)))
    x = a5 * MU + math.sqrt(a5 ** 2 * SD ** 2 + s5 ** 2) * torch.randn(20000, generator=g, dtype=F64)
    ts = torch.linspace(0.5, 0.2, 31, dtype=F64)
    out = sample_ddpm(gaussian_denoiser(sch), x, ts, sch, generator=g)
    assert abs(out.mean().item() - a2 * MU) < 0.02
    assert abs(out.var().item() - (a2 ** 2 * SD ** 2 + s2 ** 2)) < 0.03


def test_get_solver_and_grid_errors():
    assert get_solver("dpm") is sample_dpm
    with pytest.raises(ValueError, match="ddpm, ddim, dpm"):
        get_solver("euler")
    sch = make_schedule("cosine")
    den = gaussian_denoiser(sch)
    x = _x1((1, 2, 2))
    with pytest.raises(ValueError, match="decreasing"):
        sample_ddim(den, x, torch.tensor([0.0, 1.0], dtype=F64), sch)
    with pytest.raises(ValueError, match="at least 2"):
        sample_ddim(den, x, torch.tensor([1.0], dtype=F64), sch)
    with pytest.raises(ValueError, match="eta"):
        sample_ddim(den, x, time_grid(2), sch, eta=2.0)
    with pytest.raises(ValueError, match="steps"):
        time_grid(0)
    with pytest.raises(ValueError, match="uniform, logsnr"):
        time_grid(4, sch, "karras")
    with pytest.raises(ValueError, match="schedule"):
        time_grid(4, kind="logsnr")
    with pytest.raises(ValueError, match="shape"):
        sample_dpm(lambda x, t: x[:, :1], x, time_grid(2), sch)


@pytest.mark.parametrize("steps", [1, 2, 7, 12])
@pytest.mark.parametrize("kind", ["uniform", "logsnr"])
def test_time_grid(steps, kind):
    sch = make_schedule("cosine")
    ts = time_grid(steps, sch, kind)
    assert ts.dtype == F64 and ts.shape == (steps + 1,)
    assert ts[0].item() == 1.0 and ts[-1].item() == 0.0
    assert (ts[1:] < ts[:-1]).all()
    if kind == "logsnr" and steps > 1:
        lam = sch.log_snr(ts[:-1])
        d = lam[1:] - lam[:-1]
        torch.testing.assert_close(d, torch.full_like(d, 30.0 / steps), rtol=0, atol=1e-9)


# ----------------------------------------------------------------------------- process

@pytest.mark.parametrize("kind", PREDICTION_KINDS)
def test_parameterisations_round_trip(kind):
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 5, 4, generator=g, dtype=F64)
    eps = torch.randn(3, 5, 4, generator=g, dtype=F64)
    sch = make_schedule("cosine")
    alpha, sigma = sch.alpha_sigma(torch.tensor([0.1, 0.5, 0.9], dtype=F64))
    xt = add_noise(x0, eps, alpha, sigma)
    torch.testing.assert_close(xt, alpha[:, None, None] * x0 + sigma[:, None, None] * eps)
    y = target(kind, x0, eps, alpha, sigma)
    torch.testing.assert_close(pred_to_x0(kind, y, xt, alpha, sigma), x0)
    torch.testing.assert_close(pred_to_eps(kind, y, xt, alpha, sigma), eps)
    if kind == "v":
        torch.testing.assert_close(y, alpha[:, None, None] * eps - sigma[:, None, None] * x0)


def test_expand_like_and_bad_kind():
    x = torch.zeros(4, 3, 2, dtype=torch.bfloat16)
    a = expand_like(torch.arange(4, dtype=F64), x)
    assert a.shape == (4, 1, 1) and a.dtype == torch.bfloat16
    assert expand_like(0.5, x).dim() == 0
    with pytest.raises(ValueError):
        expand_like(torch.ones(3), x)
    with pytest.raises(ValueError, match="x0, eps, v"):
        target("score", x, x, 1.0, 0.0)
