"""The diffusion process, separate from the networks (as in DiT's ``diffusion/``).

schedules  noise schedules λ(t) on t ∈ [0, 1] (cosine, linear, sqrt, learned) and the
           VDM variance loss that trains the learned one.
process    forward noising and x0 / ε / v parameterisations.
solvers    samplers with one signature: DDPM (ancestral), DDIM (η), DPM-Solver++(2M).
losses     the denoising loss (one definition for training and evaluation) and the decoder
           cross-entropy on the x0 estimate.
timewarp   adaptive timestep sampling (CDCD time warping).
"""

from .process import PREDICTION_KINDS, add_noise, expand_like, pred_to_eps, pred_to_x0, target
from .schedules import SCHEDULES, Schedule, make_schedule, vdm_variance_loss
from .solvers import SOLVERS, TIME_GRIDS, get_solver, sample_ddim, sample_ddpm, sample_dpm, time_grid

__all__ = [
    "PREDICTION_KINDS", "add_noise", "expand_like", "pred_to_eps", "pred_to_x0", "target",
    "SCHEDULES", "Schedule", "make_schedule", "vdm_variance_loss",
    "SOLVERS", "TIME_GRIDS", "get_solver", "sample_ddim", "sample_ddpm", "sample_dpm", "time_grid",
]
