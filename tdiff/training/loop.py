"""The training loop shared by train-vae, train and train-ar.

AdamW (no weight decay on biases and norms), linear warm-up then cosine decay,
gradient clipping (per parameter group), gradient accumulation, EMA weights,
bf16/fp16 autocast, a time and/or step budget, NaN-step skipping, a metrics
JSONL log, and periodic atomic checkpoints that `--resume` continues from exactly.

`LoopConfig` is the one declaration of the loop's options: each field that users
set carries its command-line flag, help text and valid range in its metadata, and
the command layer builds the options of every training command from it
(tdiff/cli/commands/training_options.py). A new loop option is one field here (and a
line in the man pages).

`Trainer.run` is three reusable pieces in a loop: `train_step` (one optimizer step:
forward/backward over the micro-batches, clipping, the update, EMA), `log_step`
(the metrics record) and `maybe_checkpoint`.

Micro-batch n of a run (n = step · grad_accum + k) reseeds torch's generator and the
trainer's named generators from (seed, n) before the step function draws anything, so it is
the same micro-batch after a resume and in any process of a data-parallel run
(torchrun: tdiff/training/distributed.py, which says how the processes stay one run).
"""

from __future__ import annotations

import json
import math
import signal
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

from tdiff.files import artifacts
from tdiff.core import log
from tdiff.core.choices import LR_DECAYS
from tdiff.core.errors import (EXIT_FAILURE, EXIT_IOERR, AfterTrainingError, DataError, Interrupted, TdiffError,
    UsageError)
from tdiff.training import checkpoints as ck


def _opt(flag: str, help: str, **limits) -> dict:
    """Field metadata that makes a LoopConfig field a command-line option (limits: min, max)."""
    return {"flag": flag, "help": help, **limits}


@dataclass
class LoopConfig:
    lr: float = field(default=1e-3, metadata=_opt("--lr", "Peak learning rate (AdamW).", min=0.0))
    warmup_steps: int = field(default=100, metadata=_opt(
        "--warmup", "Learning-rate warm-up steps (then cosine decay).", min=0))
    max_steps: int = field(default=1000, metadata=_opt("--max-steps", "Stop after this many optimizer steps.", min=1))
    max_minutes: float = field(default=0.0, metadata=_opt(
        "--max-minutes", "Stop after this many minutes (0: no limit); whichever of --max-steps and "
        "--max-minutes comes first ends training with a final checkpoint.", min=0.0))
    lr_decay: str = field(default="budget", metadata=_opt(
        "--lr-decay", "What the cosine decay runs over: budget (the default: whichever of --max-steps and "
        "--max-minutes ends first, so a run stopped by the clock ends annealed; a resumed run finishes the "
        "decay in its own --max-minutes) or steps (--max-steps only: one schedule over many resumed runs, "
        "e.g. nightly cron jobs).", choices=LR_DECAYS))
    grad_accum: int = field(default=1, metadata=_opt(
        "--grad-accum", "Micro-batches accumulated per optimizer step.", min=1))
    clip: float = field(default=1.0, metadata=_opt(
        "--clip", "Gradient-norm clipping threshold (0: off); each parameter group (the denoiser, a "
        "learned schedule) is clipped on its own.", min=0.0))
    weight_decay: float = field(default=0.01, metadata=_opt(
        "--weight-decay", "AdamW weight decay (not applied to biases and norms).", min=0.0))
    ema_decay: float = field(default=0.999, metadata=_opt(
        "--ema", "EMA decay of the saved weights (0: no EMA).", min=0.0, max=0.999999))
    log_every: int = field(default=50, metadata=_opt("--log-every", "Log metrics every N steps.", min=1))
    ckpt_every: int = field(default=500, metadata=_opt(
        "--ckpt-every", "Write the training checkpoint every N steps (0: only at the end).", min=0))
    eval_every: int = field(default=0, metadata=_opt(
        "--eval-every", "Measure the held-out loss with the EMA weights every N steps and log it (heldout_* "
        "fields of the metrics log; 0: only the final figure in the summary).", min=0))
    min_lr_ratio: float = 0.1       # the cosine decay's floor, as a share of --lr
    dtype: str = "fp32"             # autocast: the command's --dtype
    seed: int = 0                   # the command's --seed


def option_fields() -> list:
    """The LoopConfig fields that are command-line options, in declaration order."""
    return [f for f in fields(LoopConfig) if "flag" in f.metadata]


def option_name(f) -> str:
    """The parameter name of field F's option (its flag: --warmup → warmup), the key in --config files."""
    return f.metadata["flag"].lstrip("-").replace("-", "_")


def step_progress(step: int, cfg: LoopConfig) -> float:
    """Share of the post-warm-up step budget spent at STEP, in [0, 1]."""
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    return min(1.0, max(0.0, (step - cfg.warmup_steps) / span))


def lr_at(step: int, cfg: LoopConfig, progress: float | None = None) -> float:
    """Linear warm-up to cfg.lr over warmup_steps, then cosine decay to lr·min_lr_ratio.

    PROGRESS (in [0, 1]) is how far the decay has gone; by default the share of the step budget.
    With ``lr_decay="budget"`` and a time budget the trainer passes the larger of that and the
    share of the time spent, so the rate reaches its floor when the budget that stops training
    runs out.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = step_progress(step, cfg) if progress is None else min(1.0, max(0.0, progress))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


@dataclass
class StepResult:
    """What one optimizer step did."""

    ok: bool                     # False: a non-finite loss or gradient, the update was skipped
    loss: float = 0.0            # the logged loss (the step function's "loss" metric, else the objective)
    metrics: dict = field(default_factory=dict)      # the step function's metrics, averaged over micro-batches
    grad_norms: dict = field(default_factory=dict)   # per clip group, before clipping
    lr: float = 0.0              # the rate the update was made with


def _is_peer_failure(e: BaseException) -> bool:
    """Whether E is a collective that failed because another rank is gone (torch.distributed's errors)."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistError", None), getattr(dist, "DistBackendError", None),
                              getattr(dist, "DistNetworkError", None)) if k is not None)
    return isinstance(e, kinds) or any(w in str(e) for w in ("Connection closed", "Connection reset", "gloo", "NCCL"))


class Trainer:
    """Runs STEP_FN until the step or time budget is spent.

    step_fn(step, micro) -> (objective tensor, metrics dict of floats, tokens in the micro-batch);
    it is called for each of the cfg.grad_accum micro-batches of an optimizer step, inside autocast,
    with MICRO the run's index of that micro-batch (which data it takes: `tdiff.data.token_ids.BatchIndex`).
    With W processes (torchrun) each calls it for its grad_accum / W share. A metric named
    "loss" is what the log shows as the loss (default: the objective) — `tdiff train` logs
    the denoiser's MSE there when the objective also holds a learned schedule's terms.

    CLIP_GROUPS: {name: parameters} clipped separately (default: all parameters as one group
    named "grad_norm"); each group's norm is logged under its name. GENERATORS: {name:
    torch.Generator} whose states the checkpoints save and `resume` restores, so a resumed
    run draws the same random numbers as an uninterrupted one. FROZEN: {name: nn.Module} that
    the step function reads but nothing trains (a distillation round's teacher): saved in every
    checkpoint and restored by `resume`, neither optimized nor averaged. AFTER_STEP(trainer) runs
    on every rank after each update (e.g. a statistic gathered from all ranks' micro-batches).
    EVALUATE() -> {name: float} measures held-out figures of the model as it is; every
    cfg.eval_every steps the trainer runs it with the EMA weights swapped in (every rank alike) and
    logs the figures in that step's record.
    """

    def __init__(self, model, step_fn: Callable, cfg: LoopConfig, device, ckpt_path=None,
                 log_path=None, fingerprint: dict | None = None, clip_groups: dict | None = None,
                 generators: dict | None = None, frozen: dict | None = None, after_step: Callable | None = None,
                 evaluate: Callable | None = None):
        import torch

        from tdiff.core.seeds import MICRO_STREAMS
        from tdiff.training import distributed

        if cfg.lr_decay not in LR_DECAYS:
            raise UsageError(f"--lr-decay {cfg.lr_decay!r}: expected one of {', '.join(LR_DECAYS)}")
        self.world, self.rank = distributed.world_size(), distributed.rank()
        if cfg.grad_accum % self.world:
            raise UsageError(f"--grad-accum {cfg.grad_accum}: must be a multiple of the {self.world} processes "
                             "(an optimizer step's micro-batches are shared out between them)")
        if len(generators or {}) >= MICRO_STREAMS:
            raise ValueError(f"at most {MICRO_STREAMS - 1} named generators")
        self.after_step = after_step
        self.evaluate = evaluate
        self._ddp = None
        self.model, self.step_fn, self.cfg, self.device = model, step_fn, cfg, device
        self.ckpt_path = Path(ckpt_path) if ckpt_path else None
        self.log_path = Path(log_path) if log_path else None
        self.fingerprint = fingerprint or {}
        self.clip_groups = {k: list(v) for k, v in (clip_groups or {"grad_norm": model.parameters()}).items()}
        self.generators = dict(generators or {})
        self.frozen = dict(frozen or {})
        decay, no_decay = [], []
        for p in model.parameters():
            if p.requires_grad:
                (decay if p.dim() >= 2 else no_decay).append(p)
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.98), eps=1e-8,
        )
        self.scaler = torch.amp.GradScaler("cuda") if (cfg.dtype == "fp16" and device.type == "cuda") else None
        self.ema = {k: v.detach().clone().float() for k, v in model.state_dict().items()} if cfg.ema_decay > 0 else None
        self.step = 0
        self.progress = 0.0             # how far the lr decay has gone (steps or time, whichever is further)
        self.elapsed = 0.0
        self.tokens = 0
        self.last_metrics: dict = {}
        self._stop = False
        self._signum = 0
        # Divergence bookkeeping: weights of step k are known good once a loss computed with them
        # is finite. The checkpoint on disk (step _ckpt_step) is rotated to PATH.prev before a new
        # one is written, so a checkpoint of weights that then blow up can be rolled back.
        self._good_step = -1
        self._ckpt_step = -1
        self._prev_step = -1
        self._win_tokens, self._win_t = 0, time.time()   # tokens/s over the last logging window

    # ------------------------------------------------------------ checkpoints
    def weights_finite(self) -> bool:
        """True when every floating weight (and EMA copy) is finite: a diverged run is not saved."""
        import torch

        tensors = list(self.model.state_dict().values()) + list((self.ema or {}).values())
        return all(bool(torch.isfinite(v).all()) for v in tensors if v.dtype.is_floating_point)

    def save_checkpoint(self) -> bool:
        """Write the training checkpoint atomically; refused (False, previous checkpoint kept) when
        the weights are not finite."""
        import torch

        if self.ckpt_path is None:
            return False
        if self.rank != 0:
            return self.weights_finite()                 # rank 0 writes; every rank holds the same weights
        if not self.weights_finite():
            log.warn(f"step {self.step}: weights are not finite (training diverged); keeping the previous "
                     f"checkpoint {self.ckpt_path}")
            return False
        if self._ckpt_step == self.step and self.ckpt_path.exists():
            return True
        if 0 <= self._ckpt_step <= self._good_step and self.ckpt_path.is_file():
            self._keep_previous()                          # not for a device or FIFO (--checkpoint /dev/null)
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        if self.ema is not None:
            tensors.update({f"ema.{k}": v for k, v in self.ema.items()})
        for name, m in self.frozen.items():
            tensors.update({f"frozen.{name}.{k}": v for k, v in m.state_dict().items()})
        ot, oinfo = ck.optimizer_to_tensors(self.opt)
        tensors.update(ot)
        tensors["rng.cpu"] = torch.get_rng_state()
        if torch.cuda.is_available() and self.device.type == "cuda":
            tensors["rng.cuda"] = torch.cuda.get_rng_state(self.device)
        for name, g in self.generators.items():
            tensors[f"rng.gen.{name}"] = g.get_state()
        info = {"step": self.step, "elapsed": self.elapsed, "tokens": self.tokens, "progress": self.progress,
                "optim": oinfo,
                "loop": asdict(self.cfg), "fingerprint": self.fingerprint}
        artifacts.save_artifact(self.ckpt_path, tensors, "checkpoint", config=self.fingerprint, train=info)
        self._ckpt_step = self.step
        return True

    def _keep_previous(self) -> None:
        """Keep the checkpoint on disk as PATH.prev (a hard link: the new one replaces PATH atomically,
        so a kill at any moment leaves a complete checkpoint at PATH)."""
        import os
        import shutil

        prev = self._prev_path()
        prev.unlink(missing_ok=True)
        try:
            os.link(self.ckpt_path, prev)
        except OSError:  # a file system without hard links
            shutil.copy2(self.ckpt_path, prev)
        self._prev_step = self._ckpt_step

    def _prev_path(self) -> Path:
        return self.ckpt_path.with_name(self.ckpt_path.name + ".prev")

    def _roll_back(self) -> str:
        """After divergence: put back the last checkpoint whose weights gave a finite loss; what was done."""
        import os

        if self.ckpt_path is None or self.rank != 0:
            return ""
        if 0 <= self._ckpt_step <= self._good_step or self._ckpt_step < 0:
            return f" (the last good checkpoint {self.ckpt_path} is kept)" if self.ckpt_path.exists() else ""
        if 0 <= self._prev_step <= self._good_step and self._prev_path().exists():
            os.replace(self._prev_path(), self.ckpt_path)
            self._ckpt_step = self._prev_step
            return f" (the last good checkpoint, step {self._prev_step}, is back in {self.ckpt_path})"
        return f" (the checkpoint {self.ckpt_path} may hold the diverging weights; no earlier good one was kept)"

    @contextmanager
    def finishing(self, what: str):
        """The steps after `run` (held-out figures, writing the output, conversions). `run` ends with a
        checkpoint of the trained weights, so a failure here loses nothing: it becomes an
        AfterTrainingError naming WHAT failed and the checkpoint that holds the weights (the same
        exit code as the failure would have had: 73/74 for files, else 1)."""
        try:
            yield
        except (Interrupted, KeyboardInterrupt, SystemExit, AfterTrainingError):
            raise
        except Exception as e:
            code = e.exit_code if isinstance(e, TdiffError) else EXIT_IOERR if isinstance(e, OSError) else EXIT_FAILURE
            reason = (getattr(e, "strerror", None) or str(e) or type(e).__name__).splitlines()[0][:300]
            if isinstance(e, OSError) and e.filename:
                reason += f": {e.filename}"
            if self.ckpt_path is not None and self.ckpt_path.is_file() and self._ckpt_step == self.step:
                kept = f"the trained weights are safe in the checkpoint {self.ckpt_path} (step {self.step})"
            else:
                kept = "no checkpoint file holds the trained weights (--checkpoint is not a regular file)"
            raise AfterTrainingError(f"training finished, but {what} failed ({reason}); {kept}",
                                     self.ckpt_path, code) from e

    def discard_previous(self) -> None:
        """Remove the rotated PATH.prev once training has finished well."""
        if self.ckpt_path is not None and self.rank == 0:
            self._prev_path().unlink(missing_ok=True)

    def resume(self) -> bool:
        """Load the last checkpoint if there is one; True when training continues from it."""
        import torch

        if self.ckpt_path is None or not self.ckpt_path.exists():
            return False
        if not self.ckpt_path.is_file():                 # --checkpoint /dev/null: nothing to read back
            log.warn(f"--resume: the checkpoint {self.ckpt_path} is not a regular file; starting from step 0")
            return False
        art = artifacts.load_artifact(self.ckpt_path, expect="checkpoint", device="cpu")
        info = art.train
        if info.get("fingerprint") != self.fingerprint:
            raise DataError(
                f"{self.ckpt_path}: checkpoint was made with a different model or data configuration; "
                "remove it or train without --resume"
            )
        try:
            self.model.load_state_dict(art.sub("model"))
        except RuntimeError as e:
            raise DataError(f"{self.ckpt_path}: does not match this model ({str(e).splitlines()[0]})") from None
        if self.ema is not None and any(k.startswith("ema.") for k in art.tensors):
            self.ema = {k: v.float().to(self.device) for k, v in art.sub("ema").items()}
        for name, m in self.frozen.items():
            try:
                m.load_state_dict(art.sub(f"frozen.{name}"))
            except RuntimeError as e:
                raise DataError(f"{self.ckpt_path}: its {name} does not match ({str(e).splitlines()[0]})") from None
        ck.optimizer_from_tensors(self.opt, {k: v.to(self.device) for k, v in art.tensors.items()
                                             if k.startswith("optim.")}, info["optim"])
        torch.set_rng_state(art.tensors["rng.cpu"])
        if "rng.cuda" in art.tensors and self.device.type == "cuda":
            torch.cuda.set_rng_state(art.tensors["rng.cuda"], self.device)
        for name, g in self.generators.items():
            state = art.tensors.get(f"rng.gen.{name}")
            if state is None:
                raise DataError(f"{self.ckpt_path}: holds no state of the '{name}' random generator "
                                "(made by an older tdiff); remove it or train without --resume")
            g.set_state(state)
        self.step, self.elapsed, self.tokens = info["step"], info["elapsed"], info.get("tokens", 0)
        self._ckpt_step = self.step
        self.progress = info.get("progress", step_progress(self.step, self.cfg))
        log.info(f"resumed from {self.ckpt_path} at step {self.step}")
        return True

    def maybe_checkpoint(self) -> None:
        """The periodic checkpoint: every cfg.ckpt_every steps."""
        if self.cfg.ckpt_every > 0 and self.step % self.cfg.ckpt_every == 0:
            self.save_checkpoint()

    # ------------------------------------------------------------ EMA
    def _update_ema(self) -> None:
        import torch

        if self.ema is None:
            return
        d = min(self.cfg.ema_decay, (1 + self.step) / (10 + self.step))
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                e = self.ema[k]
                if v.dtype.is_floating_point:
                    e.lerp_(v.float(), 1 - d)
                else:
                    e.copy_(v)

    def held_out(self) -> dict:
        """EVALUATE() with the EMA weights in the model (the weights that are saved), then the training
        weights back; {} without an evaluate function."""
        import torch

        if self.evaluate is None:
            return {}
        live = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        was_training = self.model.training
        try:
            if self.ema is not None:
                self.model.load_state_dict({k: v.to(live[k].dtype) for k, v in self.ema.items()})
            self.model.eval()
            with torch.no_grad():
                return {k: float(v) for k, v in self.evaluate().items()}
        finally:
            self.model.load_state_dict(live)
            self.model.train(was_training)

    def ema_state_dict(self) -> dict:
        return self.ema if self.ema is not None else {k: v.detach() for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------ one step
    def set_lr(self, t_start: float, progress0: float) -> float:
        """The rate for the coming step (warm-up, then cosine over steps or the time budget)."""
        cfg = self.cfg
        self.progress = max(self.progress, step_progress(self.step, cfg))
        if cfg.lr_decay == "budget" and cfg.max_minutes > 0 and self.step >= cfg.warmup_steps:
            # A resumed run decays the rest of the way within its own time budget.
            frac = (time.time() - t_start) / (cfg.max_minutes * 60)
            self.progress = max(self.progress, progress0 + (1 - progress0) * frac)
        lr = lr_at(self.step, cfg, self.progress)
        for g in self.opt.param_groups:
            g["lr"] = lr
        return lr

    def _seed_micro(self, micro: int) -> None:
        """Reseed torch's generator and the named generators for micro-batch MICRO (tdiff.seeds.micro_seed)."""
        import torch

        from tdiff.core.seeds import micro_seed

        torch.manual_seed(micro_seed(self.cfg.seed, micro, 0))
        for slot, name in enumerate(sorted(self.generators), start=1):
            self.generators[name].manual_seed(micro_seed(self.cfg.seed, micro, slot))

    def _wrapped(self):
        """The DistributedDataParallel wrapper of the step function (W > 1), made on first use,
        after a resume has loaded the weights."""
        if self._ddp is None:
            import torch.nn as nn
            from torch.nn.parallel import DistributedDataParallel

            class StepModule(nn.Module):
                def __init__(self, model, fn):
                    super().__init__()
                    self.model, self.fn = model, fn

                def forward(self, step, micro):
                    return self.fn(step, micro)

            ids = [self.device.index] if self.device.type == "cuda" else None
            self._ddp = DistributedDataParallel(StepModule(self.model, self.step_fn), device_ids=ids,
                                                find_unused_parameters=False)
        return self._ddp

    def _forward(self, micro: int):
        if self.world == 1:
            return self.step_fn(self.step, micro)
        return self._wrapped()(self.step, micro)

    def _sync(self, last: bool):
        """DDP's no_sync for all but the last local micro-batch (one all-reduce per optimizer step)."""
        import contextlib

        if self.world == 1 or last:
            return contextlib.nullcontext()
        return self._wrapped().no_sync()

    def _clip(self) -> dict:
        """Clip each group's gradient to cfg.clip on its own; their norms before clipping."""
        import torch

        limit = self.cfg.clip if self.cfg.clip > 0 else float("inf")
        return {name: torch.nn.utils.clip_grad_norm_(params, limit) for name, params in self.clip_groups.items()}

    def train_step(self) -> StepResult:
        """One optimizer step over cfg.grad_accum micro-batches; skipped (ok=False) when the loss or a
        gradient is not finite. Advances self.step and the EMA when the update is made."""
        import torch

        from tdiff.core.device import autocast
        from tdiff.training import distributed

        cfg = self.cfg
        self.opt.zero_grad(set_to_none=True)
        objective, metrics, ok, ntok_step = 0.0, {}, True, 0
        share = cfg.grad_accum // self.world                     # micro-batches of this process
        first = self.step * cfg.grad_accum + self.rank * share   # the run's index of the first of them
        for j in range(share):
            micro = first + j
            self._seed_micro(micro)
            last = j == share - 1
            with self._sync(last), autocast(self.device, cfg.dtype):
                loss, m, ntok = self._forward(micro)
            # W processes each add grad_accum/W micro-batches and DDP averages over W: scale by W.
            loss = loss * self.world / cfg.grad_accum
            if not torch.isfinite(loss):
                ok = False
                if self.world == 1:
                    break
                # W > 1: go on (the backward makes the gradients non-finite on every rank after the
                # all-reduce, and all ranks skip the step together; none waits in a collective alone)
            else:
                self._good_step = max(self._good_step, self.step)     # these weights give a finite loss
            with self._sync(last):
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            objective += float(loss.detach()) / self.world
            ntok_step += ntok
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + float(v) / cfg.grad_accum
        if self.world > 1:                                            # one run: sum the shares of every rank
            keys = sorted(metrics)
            red = distributed.all_reduce([objective, ntok_step, 0.0 if ok else 1.0] + [metrics[k] for k in keys],
                                         device=self.device)
            objective, ntok_step, ok = red[0], int(red[1]), ok and red[2] == 0
            metrics = dict(zip(keys, red[3:]))
        self._win_tokens += ntok_step
        self.tokens += ntok_step
        if self.scaler:
            self.scaler.unscale_(self.opt)
        norms = self._clip()
        if not ok or not all(torch.isfinite(n) for n in norms.values()):
            self.opt.zero_grad(set_to_none=True)
            if self.scaler:
                self.scaler.update()
            return StepResult(ok=False)
        try:
            if self.scaler:
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                self.opt.step()
        except RuntimeError as e:  # e.g. "value cannot be converted to type float without overflow"
            if "overflow" not in str(e):
                raise
            raise TdiffError(f"step {self.step + 1}: the optimizer update overflowed (lower --lr)"
                             + self._roll_back()) from None
        self.step += 1
        self._update_ema()
        if self.after_step is not None:
            self.after_step(self)
        logged = metrics.pop("loss", objective)
        return StepResult(ok=True, loss=logged, metrics=metrics, lr=self.opt.param_groups[0]["lr"],
                          grad_norms={k: float(v) for k, v in norms.items()})

    def log_step(self, res: StepResult, logf=None) -> None:
        """Every cfg.log_every steps (and the first and last): a metrics record to LOGF and a line on stderr."""
        cfg = self.cfg
        due = cfg.eval_every > 0 and self.step % cfg.eval_every == 0 and self.evaluate is not None
        held = self.held_out() if due else {}          # every rank (the model may hold collectives' state)
        if self.rank != 0 or not (due or self.step % cfg.log_every == 0 or self.step == 1 or
                                  self.step == cfg.max_steps):
            return
        now = time.time()
        rec = {"step": self.step, "loss": round(res.loss, 6), "lr": res.lr,
               **{k: round(v, 4) for k, v in res.grad_norms.items()},
               "tokens_per_s": round(self._win_tokens / max(1e-9, now - self._win_t), 1),
               "elapsed_s": round(self.elapsed, 2),
               **{k: round(v, 6) for k, v in res.metrics.items()},
               **{k: round(v, 6) for k, v in held.items()}}
        self._win_tokens, self._win_t = 0, now
        if logf:
            logf.write(json.dumps(rec) + "\n")
            logf.flush()
        extra = " ".join(f"{k} {v:.4g}" for k, v in {**res.metrics, **held}.items())
        log.info(f"step {self.step:>6}  loss {res.loss:.4f}  {extra}  lr {res.lr:.2e}  "
                 f"{rec['tokens_per_s']:.0f} tok/s  {self.elapsed:.0f}s")

    # ------------------------------------------------------------ the loop
    def _on_signal(self, signum, frame):
        self._stop, self._signum = True, signum
        log.warn(f"signal {signum}: stopping after this step and writing a checkpoint")

    def _out_of_time(self, t_start: float) -> bool:
        cfg = self.cfg
        return cfg.max_minutes > 0 and (time.time() - t_start) >= cfg.max_minutes * 60

    def _agreed_stop(self, t_start: float) -> bool:
        """Stop now? A signal or the time budget; with W processes agreed by all ranks (any rank's
        signal or clock stops every rank at the same step)."""
        from tdiff.training import distributed

        timeout = self._out_of_time(t_start)
        if self.world > 1:
            sig, late = distributed.all_reduce([float(self._signum if self._stop else 0), float(timeout)], "max",
                                               device=self.device)
            if sig and not self._stop:
                self._stop, self._signum = True, int(sig)
            timeout = late > 0
        if timeout and not self._stop:
            log.info(f"time budget of {self.cfg.max_minutes:g} min reached at step {self.step}")
        return self._stop or timeout

    def run(self) -> dict:
        cfg = self.cfg
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        logf = open(self.log_path, "a", encoding="utf-8") if self.log_path and self.rank == 0 else None
        t_start = time.time()
        elapsed0, progress0 = self.elapsed, self.progress
        nonfinite = 0
        self._win_tokens, self._win_t = 0, time.time()
        bar_cm = log.progress()                    # a bar on a terminal (rank 0 only: others are quiet)
        bar = bar_cm.__enter__()
        task = bar.add_task("train", total=cfg.max_steps, completed=self.step, unit=" steps")
        try:
            self.model.train()
            while self.step < cfg.max_steps and not self._agreed_stop(t_start):
                self.set_lr(t_start, progress0)
                res = self.train_step()
                if not res.ok:
                    nonfinite += 1
                    log.warn(f"step {self.step}: non-finite loss or gradient, step skipped")
                    if nonfinite >= 20:
                        raise TdiffError(
                            f"loss is NaN/inf for {nonfinite} steps in a row at step {self.step}; "
                            "lower --lr, use --dtype fp32, or check the data" + self._roll_back()
                        )
                    continue
                nonfinite = 0
                self.elapsed = elapsed0 + time.time() - t_start
                self.last_metrics = {"loss": res.loss, **res.metrics}
                self.log_step(res, logf)
                bar.update(task, completed=self.step, description=f"train  loss {res.loss:.4f}")
                self.maybe_checkpoint()
            if not self.save_checkpoint() and not self.weights_finite():
                raise TdiffError(f"training diverged: the weights are not finite after step {self.step}; "
                                 "nothing written (lower --lr)" + self._roll_back())
            if not self._stop:
                self.discard_previous()
            if self._stop:
                where = f"checkpoint at step {self.step} in {self.ckpt_path}; rerun with --resume to continue" \
                    if self.ckpt_path else "no checkpoint"
                raise Interrupted(f"interrupted by signal {self._signum}: {where}", self._signum)
        except RuntimeError as e:
            if self.world == 1 or not _is_peer_failure(e):
                raise
            kept = f"the last checkpoint {self.ckpt_path} (step {self._ckpt_step}) is intact" \
                if self.ckpt_path and self._ckpt_step >= 0 else "no checkpoint was written"
            raise TdiffError(f"rank {self.rank}: another process of this run stopped ({str(e).splitlines()[0][:160]}); "
                             f"{kept}; rerun with --resume") from None
        finally:
            bar_cm.__exit__(None, None, None)
            for s, h in old.items():
                signal.signal(s, h)
            if logf:
                logf.close()
        return {"steps": self.step, "elapsed_s": round(self.elapsed, 2), "tokens": self.tokens,
                "interrupted": self._stop, **{k: round(v, 6) for k, v in self.last_metrics.items()}}
