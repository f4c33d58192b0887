"""Distil a trained model (the teacher) into a few-step student: the `student` artifact.

Two methods (the equations are in tdiff/diffusion/distillation.py):

- **progressive** (Salimans & Ho 2022, Algorithm 2). Rounds halve the step count, FROM_STEPS →
  FROM_STEPS/2 → … → TO_STEPS, each student initialised from its teacher (the previous round's
  EMA weights). A step draws t on the student's uniform grid {1/N, …, 1}, noises the data there,
  lets the teacher take two deterministic DDIM steps t → t − 1/2N → t − 1/N, and regresses the
  student's x0 estimate on the x̃ that reaches the same point in one DDIM step, weighted by the
  truncated SNR max(α²/σ², 1). The student samples with DDIM on the uniform N-step grid.
- **consistency** (Song et al. 2023, Algorithm 2). The teacher's probability-flow ODE is
  discretised on the uniform grid t_n = n/N (N = FROM_STEPS) and solved one step at a time with
  DDIM. A step draws n, noises the data at t_{n+1}, takes the teacher's step to t_n and regresses
  the student's f(x_{t_{n+1}}, t_{n+1}) on its own stop-gradient f(x_{t_n}, t_n) (x_{t_n} itself at
  n = 0: the boundary condition). The target network is the student itself without gradient
  (μ = 0, as Song & Dhariwal 2023, "Improved Techniques for Training Consistency Models", §3.2,
  recommend), and d is the squared L2 distance in latent space. The student's f is its x0
  estimate: for the default v-prediction that is f = c_skip(t) x_t + c_out(t) F(x_t, t) with
  c_skip = α_t, c_out = −σ_t, which is the usual skip/out parameterisation of Song et al. 2023
  (EDM's σ_d²/(σ²+σ_d²) and σσ_d/√(σ²+σ_d²) at σ_data = 1, written in VP form). It samples with
  multistep consistency sampling (`solvers.sample_consistency`), TO_STEPS steps by default.

Both use the teacher's own conditioning: each step draws known spans and labels exactly as
`tdiff train` does (the teacher's --cond-prob and --label-dropout), so a student prompts,
infills and follows labels like its teacher. The teacher runs with its self-conditioning (a
first pass's x0 estimate fed back: two passes per call); the student is trained and sampled
without self-conditioning (it has no earlier step to condition on).

One `Trainer` (tdiff/training/loop.py) per round: time budget, periodic atomic checkpoints,
`--resume` (the checkpoint records its round and, from round two, the round's teacher), metrics
JSONL (one record per logged step, with its "round"), bf16 autocast and EMA weights.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from tdiff.files import artifacts
from tdiff.core import log
from tdiff.core.choices import DISTILL_METHODS
from tdiff.core.errors import DataError, UsageError
from tdiff.files.streams import file_sha256
from tdiff.formats.model import save_model
from tdiff.training import distributed
from tdiff.training.loop import LoopConfig, Trainer

STUDENT_SOLVER = {"progressive": "ddim", "consistency": "consistency"}
HELD_OUT_MAX = 256   # held-out sequences per figure: a consistency figure costs N teacher calls on each


@dataclass
class DistillConfig:
    method: str = "progressive"
    from_steps: int = 64       # progressive: the first teacher's steps; consistency: the ODE's discretisation N
    to_steps: int = 4          # the student's steps (progressive: of the last round; consistency: its default)
    batch_size: int = 64
    holdout: float = 0.02
    loop: LoopConfig = field(default_factory=LoopConfig)   # max_steps per round; max_minutes in all


def plan(method: str, from_steps: int, to_steps: int) -> list[int]:
    """The student step count of each round: [from/2, …, to] (progressive) or [to] (consistency)."""
    from tdiff.diffusion.distillation import rounds

    if method not in DISTILL_METHODS:
        raise UsageError(f"--method {method!r}: choose one of {', '.join(DISTILL_METHODS)}")
    if method == "consistency":
        if to_steps > from_steps:
            raise UsageError(f"--to-steps {to_steps}: at most --from-steps ({from_steps})")
        return [to_steps]
    try:
        return rounds(from_steps, to_steps)
    except ValueError as e:
        raise UsageError(f"--from-steps/--to-steps: {e}") from None


def check_teacher(bundle, path, method: str, from_steps: int) -> None:
    """Refuse a teacher that cannot teach METHOD from FROM_STEPS (a clear DataError/UsageError)."""
    if bundle.dit.config.block_causal:
        raise UsageError(f"-m {path}: a block-causal model (train --block-size) cannot be distilled yet; "
                         "distil a parallel model")
    if bundle.kind != "student":
        return
    info = bundle.config.get("student", {})
    if info.get("method") == "consistency":
        raise DataError(f"{path}: a consistency student is not a diffusion model and cannot be a teacher; "
                        "distil from its teacher instead")
    steps = info.get("steps")
    if from_steps != steps:
        raise UsageError(f"--from-steps {from_steps}: the teacher {path} is a progressive student distilled "
                         f"for {steps} steps; its ODE is only learned on that grid (use --from-steps {steps})")


class _Loss:
    """The per-example distillation loss of one method, shared by training and the held-out figure."""

    def __init__(self, method: str, steps: int, from_steps: int, schedule, teacher, student):
        self.method, self.steps, self.from_steps = method, steps, from_steps
        self.schedule, self.teacher, self.student = schedule, teacher, student

    def coeffs(self, t):
        """α_t, σ_t (B,) float64, with the data at t = 0 (α = 1, σ = 0) exactly."""
        import torch

        with torch.no_grad():
            a, s = self.schedule.alpha_sigma(t)
        zero = t <= 0
        return torch.where(zero, torch.ones_like(a), a), torch.where(zero, torch.zeros_like(s), s)

    def teacher_x0(self, x, t, cond):
        """The teacher's x0 estimate, with its self-conditioning fed its own first pass."""
        first = self.teacher.x0_estimate(x, t.float(), **cond)
        if not self.teacher.diffusion.get("self_condition", False):
            return first
        return self.teacher.x0_estimate(x, t.float(), self_cond=first, **cond)

    def trajectory_error(self, x0, generator):
        """Per-example (B,) mean squared distance between the student's one-call jump f(x_t, t) and
        where the teacher's ODE, solved with DDIM on the N-step grid, takes x_t: what a consistency
        student is for. t is drawn on the grid {1/N, …, 1}; x_t noises X0 (B, N, D) there."""
        import torch

        from tdiff.diffusion import distillation as dd
        from tdiff.diffusion.process import add_noise

        n = self.from_steps
        b, dev = x0.shape[0], x0.device
        m = torch.randint(1, n + 1, (b,), generator=generator, device=dev)               # (B,) start index
        a, s = self.coeffs(dd.grid_times(m, n))
        x_t = add_noise(x0, torch.randn(x0.shape, generator=generator, device=dev), a.float(), s.float())
        x = x_t
        for k in range(n, 0, -1):                       # rows whose start is at or above k take the step k → k−1
            active = m >= k                                                               # (B,)
            if not bool(active.any()):
                continue
            t = torch.full((b,), k / n, dtype=torch.float64, device=dev)
            at, st = self.coeffs(t)
            as_, ss = self.coeffs(t - 1 / n)
            step = dd.ddim_update(x, self.teacher_x0(x, t, {}), at, st, as_, ss)        # (B, N, D)
            x = torch.where(active[:, None, None], step, x)
        jump = self.student.x0_estimate(x_t, dd.grid_times(m, n).float()).float()         # (B, N, D)
        return ((jump - x.float()) ** 2).mean((1, 2))

    def __call__(self, x0, generator, cond_x=None, cond_mask=None, label=None):
        """Per-example loss (B,) on the unknown positions of clean latents X0 (B, N, D)."""
        import torch

        from tdiff.diffusion import distillation as dd
        from tdiff.diffusion.process import add_noise
        from tdiff.diffusion.spans import merge

        b, dev = x0.shape[0], x0.device
        cond = {"label": label, "cond_x": cond_x, "cond_mask": cond_mask}
        n = self.steps if self.method == "progressive" else self.from_steps
        lo = 1 if self.method == "progressive" else 0
        i = torch.randint(lo, n + lo, (b,), generator=generator, device=dev)                 # (B,) in [lo, n + lo)
        if self.method == "progressive":
            t = dd.grid_times(i, n)                                    # (B,) student grid point
            s = dd.grid_times(i - 1, n)                                # one student step later
            mid = (t + s) / 2                                          # the teacher's intermediate point
        else:
            t = dd.grid_times(i + 1, n)                                # t_{n+1}
            s = dd.grid_times(i, n)                                    # t_n
        at, st = self.coeffs(t)
        as_, ss = self.coeffs(s)
        eps = torch.randn(x0.shape, generator=generator, device=dev)   # (B, N, D)
        x_t = merge(add_noise(x0, eps, at.float(), st.float()), cond_x, cond_mask)   # (B, N, D)
        with torch.no_grad():
            if self.method == "progressive":
                am, sm = self.coeffs(mid)
                x_m = dd.ddim_update(x_t, self.teacher_x0(x_t, t, cond), at, st, am, sm)       # (B, N, D)
                x_s = dd.ddim_update(x_m, self.teacher_x0(x_m, mid, cond), am, sm, as_, ss)
                target = dd.progressive_target(x_t, x_s, at, st, as_, ss)                    # (B, N, D) x̃
                weight = dd.truncated_snr_weight(at, st).float()                             # (B,)
            else:
                x_s = dd.ddim_update(x_t, self.teacher_x0(x_t, t, cond), at, st, as_, ss)       # (B, N, D)
                f_s = self.student.x0_estimate(x_s, s.float(), **cond)
                target = dd.consistency_target(x_s, f_s.float(), s)
                weight = torch.ones(b, device=dev)
        pred = self.student.x0_estimate(x_t, t.float(), **cond).float()                      # (B, N, D)
        err = (pred - target.float()) ** 2                                                    # (B, N, D)
        w = (1 - cond_mask) if cond_mask is not None else torch.ones_like(err[..., :1])     # (B, N, 1)
        mse = (err * w).sum((1, 2)) / (w.sum((1, 2)) * err.shape[-1]).clamp_min(1)           # (B,)
        return weight.to(mse.device) * mse


def _heldout(loss_fn, lat, seed: int, device, batch_size: int = 256) -> float:
    """The held-out figure of a round, on held-out latents with fixed draws (no spans, no labels):
    progressive: the mean distillation loss; consistency: `trajectory_error` (the consistency loss
    compares the student with itself and need not fall while the student improves)."""
    import torch

    from tdiff.core.seeds import generator

    g = generator(seed, 0, "eval", device)
    fn = loss_fn.trajectory_error if loss_fn.method == "consistency" else loss_fn
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(lat), batch_size):
            x0 = lat[i:i + batch_size]
            total += float(fn(x0, g).sum())
            count += len(x0)
    return total / max(1, count)


def distill(input_path, output: Path, teacher_path: Path, dc: DistillConfig, device, ckpt_path: Path,
            log_path=None, resume=False) -> dict:
    import torch.nn as nn

    from tdiff.data import token_ids as D
    from tdiff.formats.model import Bundle, load_model
    from tdiff.core.device import seed_everything
    from tdiff.data.latents import encode_latents
    from tdiff.core.seeds import generator
    from tdiff.training.latent_data import draw_conditions, load_latents

    student_steps = plan(dc.method, dc.from_steps, dc.to_steps)
    teacher = load_model(teacher_path, device)
    check_teacher(teacher, teacher_path, dc.method, dc.from_steps)
    teacher.dit.requires_grad_(False)
    teacher.schedule.requires_grad_(False)
    teacher.vae.requires_grad_(False)
    vae, tok = teacher.vae, teacher.tokenizer
    diff = teacher.diffusion
    cond_prob = float(diff.get("cond_prob", 0.0)) if diff.get("known_spans") else 0.0
    tcfg = teacher.train.get("config", {}) if isinstance(teacher.train, dict) else {}
    label_field = teacher.config.get("labels", {}).get("field", "")
    label_dropout = float(tcfg.get("label_dropout", 0.1))
    seed_everything(dc.loop.seed)
    ld = load_latents(input_path, vae, tok, holdout=dc.holdout, label_field=label_field, device=device,
                      need_ids=cond_prob > 0, label_names=teacher.labels or None)
    if ld.lat.shape[1:] != tuple(teacher.latent_shape):
        raise DataError(f"{teacher_path}: latents of shape {tuple(ld.lat.shape[1:])} do not fit the teacher")
    held = ld.held.seqs[:HELD_OUT_MAX]            # the held-out figures use at most this many sequences
    held_lat = encode_latents(vae, held, vae.config.max_len, tok.pad_id, device) if held else None
    student_diff = {**diff, "self_condition": False}
    teacher_sha = file_sha256(teacher_path)
    n_rounds = len(student_steps)
    log.info(f"distill: {dc.method}, teacher {teacher_path} ({teacher.dit.num_params() / 1e6:.2f}M), "
             f"{len(ld.train.seqs):,} sequences, rounds {' → '.join(map(str, [dc.from_steps] + student_steps))}"
             + (" steps" if dc.method == "progressive" else f" (ODE grid {dc.from_steps}, student {dc.to_steps} steps)")
             + f", known spans {cond_prob}, device {device}")

    start = 0
    if resume and ckpt_path.exists():
        import json

        meta = artifacts.read_metadata(ckpt_path)       # the header only: the Trainer loads the tensors
        try:
            info = json.loads(meta["train"]) if meta.get("tdiff.kind") == "checkpoint" else {}
        except (KeyError, ValueError):
            info = {}
        fp = info.get("fingerprint") if isinstance(info, dict) else None
        r = fp.get("round") if isinstance(fp, dict) else None
        if not isinstance(r, int) or not 0 <= r < n_rounds:
            raise DataError(f"{ckpt_path}: not a checkpoint of this distillation; remove it or run without --resume")
        start = r

    per_round = replace(dc.loop, max_minutes=dc.loop.max_minutes / n_rounds) if dc.loop.max_minutes > 0 else dc.loop
    teacher_dit = teacher.dit
    history, summary = [], {}
    for r in range(start, n_rounds):
        steps = student_steps[r]
        from_steps = dc.from_steps if (r == 0 or dc.method == "consistency") else student_steps[r - 1]
        round_teacher = teacher_dit if r == 0 else copy.deepcopy(teacher_dit)
        round_teacher.requires_grad_(False).eval()
        student_dit = copy.deepcopy(round_teacher).requires_grad_(True)
        module = nn.Module()
        module.dit = student_dit
        t_bundle = Bundle(vae=vae, dit=round_teacher, schedule=teacher.schedule, tokenizer=tok,
                          diffusion=diff if (r == 0 or dc.method == "consistency") else student_diff)
        s_bundle = Bundle(vae=vae, dit=student_dit, schedule=teacher.schedule, tokenizer=tok, diffusion=student_diff)
        loss_fn = _Loss(dc.method, steps, from_steps, teacher.schedule, t_bundle, s_bundle)
        gen = generator(dc.loop.seed, r, "noise", device)
        order = D.BatchIndex(len(ld.train.seqs), dc.batch_size, dc.loop.seed + r)

        def step_fn(step, micro, loss_fn=loss_fn, gen=gen, r=r, order=order):
            idx = order(micro).to(device)
            cond_x, cond_mask, label = draw_conditions(ld, idx, vae, tok, cond_prob=cond_prob,
                                                       label_dropout=label_dropout, generator=gen)
            loss = loss_fn(ld.lat[idx], gen, cond_x=cond_x, cond_mask=cond_mask, label=label).mean()
            return loss, {"round": float(r + 1), "student_steps": float(steps)}, len(idx) * vae.config.max_len

        fingerprint = {"teacher": teacher_sha, "data": ld.data.digest, "round": r,
                       "distill": asdict(dc) | {"loop": None}}
        frozen = {"teacher": round_teacher} if r > 0 else {}
        trainer = Trainer(module, step_fn, replace(per_round, seed=dc.loop.seed + r), device,   # own streams per round
                          ckpt_path=ckpt_path, log_path=log_path,
                          fingerprint=fingerprint, clip_groups={"grad_norm": student_dit.parameters()},
                          generators={"noise": gen}, frozen=frozen,
                          evaluate=lambda loss_fn=loss_fn: {} if held_lat is None else
                          {"heldout_loss": _heldout(loss_fn, held_lat, dc.loop.seed, device)})
        resumed = resume and r == start and trainer.resume()
        if not resumed and r > 0:
            trainer.save_checkpoint()      # the round's teacher is on disk before its first step
        before = _heldout(loss_fn, held_lat, dc.loop.seed, device) if held_lat is not None else None
        summary = trainer.run()
        with trainer.finishing(f"round {r + 1}'s held-out figures"):
            ema = trainer.ema_state_dict()
            student_dit.load_state_dict({k[4:]: v for k, v in ema.items() if k.startswith("dit.")})
            after = _heldout(loss_fn, held_lat, dc.loop.seed, device) if held_lat is not None else None
            rec = {"round": r + 1, "from_steps": from_steps, "steps": steps, "train_steps": summary["steps"],
                   "elapsed_s": summary["elapsed_s"]}
            if before is not None:
                rec.update(heldout_before=round(before, 6), heldout_after=round(after, 6))
            history.append(rec)
            log.info(f"distill: round {r + 1}/{n_rounds} ({from_steps} → {steps} steps): {summary['steps']} steps"
                     + (f", held-out distillation loss {before:.4f} → {after:.4f}" if before is not None else ""))
        teacher_dit = student_dit                       # the EMA student teaches the next round

    with trainer.finishing(f"writing {output}"):
        parts = {"vae": vae.state_dict(), "dit": {k: v.detach() for k, v in teacher_dit.state_dict().items()},
                 "schedule": teacher.schedule.state_dict()}
        config = {k: v for k, v in teacher.config.items() if k not in ("timewarp", "student")}
        config["diffusion"] = student_diff
        config["student"] = {"method": dc.method, "steps": dc.to_steps, "solver": STUDENT_SOLVER[dc.method],
                             "time_grid": "uniform", "from_steps": dc.from_steps,
                             "rounds": student_steps if dc.method == "progressive" else [dc.to_steps],
                             "teacher": {"file": Path(teacher_path).name, "sha256": teacher_sha}}
        out = {**summary, "rounds": history}
        if distributed.is_main():                     # rank 0 writes (torchrun)
            save_model(output, "student", parts, config,
                       {**out, "seed": dc.loop.seed, "data": ld.data.digest, "config": asdict(dc),
                        "teacher_train": teacher.train}, tok)
        log.info(f"distill: wrote {output}")
    return out
