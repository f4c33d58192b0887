"""The training loop shared by train-vae, train and train-ar.

AdamW (no weight decay on biases and norms), linear warm-up then cosine decay,
gradient clipping, gradient accumulation, EMA weights, bf16/fp16 autocast,
a time and/or step budget, NaN-step skipping, a metrics JSONL log, and
periodic atomic checkpoints that `--resume` continues from exactly.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from tdiff import log
from tdiff.errors import DataError, TdiffError, UsageError
from tdiff.training import checkpoints as ck


LR_DECAYS = ("budget", "steps")


@dataclass
class LoopConfig:
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_steps: int = 100
    max_steps: int = 1000
    max_minutes: float = 0.0        # 0: no time budget
    lr_decay: str = "steps"         # cosine decay over: "steps" (--max-steps) | "budget" (steps or time, first to end)
    grad_accum: int = 1
    clip: float = 1.0
    ema_decay: float = 0.999        # 0: no EMA
    min_lr_ratio: float = 0.1
    dtype: str = "fp32"
    seed: int = 0
    log_every: int = 50
    ckpt_every: int = 500


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


class Trainer:
    """Runs STEP_FN until the step or time budget is spent.

    step_fn(step) -> (loss tensor, metrics dict of floats, tokens in the micro-batch);
    it is called cfg.grad_accum times per optimizer step, inside autocast.
    """

    def __init__(self, model, step_fn: Callable, cfg: LoopConfig, device, ckpt_path=None,
                 log_path=None, fingerprint: dict | None = None):
        import torch

        if cfg.lr_decay not in LR_DECAYS:
            raise UsageError(f"--lr-decay {cfg.lr_decay!r}: expected one of {', '.join(LR_DECAYS)}")
        self.model, self.step_fn, self.cfg, self.device = model, step_fn, cfg, device
        self.ckpt_path = Path(ckpt_path) if ckpt_path else None
        self.log_path = Path(log_path) if log_path else None
        self.fingerprint = fingerprint or {}
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

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> None:
        import torch

        if self.ckpt_path is None:
            return
        tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        if self.ema is not None:
            tensors.update({f"ema.{k}": v for k, v in self.ema.items()})
        ot, oinfo = ck.optimizer_to_tensors(self.opt)
        tensors.update(ot)
        tensors["rng.cpu"] = torch.get_rng_state()
        if torch.cuda.is_available() and self.device.type == "cuda":
            tensors["rng.cuda"] = torch.cuda.get_rng_state(self.device)
        info = {"step": self.step, "elapsed": self.elapsed, "tokens": self.tokens, "progress": self.progress,
                "optim": oinfo,
                "loop": asdict(self.cfg), "fingerprint": self.fingerprint}
        ck.save_artifact(self.ckpt_path, tensors, "checkpoint", config=self.fingerprint, train=info)

    def resume(self) -> bool:
        """Load the last checkpoint if there is one; True when training continues from it."""
        import torch

        if self.ckpt_path is None or not self.ckpt_path.exists():
            return False
        art = ck.load_artifact(self.ckpt_path, expect="checkpoint", device="cpu")
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
        ck.optimizer_from_tensors(self.opt, {k: v.to(self.device) for k, v in art.tensors.items()
                                             if k.startswith("optim.")}, info["optim"])
        torch.set_rng_state(art.tensors["rng.cpu"])
        if "rng.cuda" in art.tensors and self.device.type == "cuda":
            torch.cuda.set_rng_state(art.tensors["rng.cuda"], self.device)
        self.step, self.elapsed, self.tokens = info["step"], info["elapsed"], info.get("tokens", 0)
        self.progress = info.get("progress", step_progress(self.step, self.cfg))
        log.info(f"resumed from {self.ckpt_path} at step {self.step}")
        return True

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

    def ema_state_dict(self) -> dict:
        return self.ema if self.ema is not None else {k: v.detach() for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------ the loop
    def _on_signal(self, signum, frame):
        self._stop = True
        log.warn(f"signal {signum}: stopping after this step and writing a checkpoint")

    def run(self) -> dict:
        import torch

        from tdiff.device import autocast

        cfg = self.cfg
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        logf = open(self.log_path, "a", encoding="utf-8") if self.log_path else None
        t_start = time.time()
        elapsed0, progress0 = self.elapsed, self.progress
        nonfinite = 0
        win_tokens, win_t = 0, time.time()
        try:
            self.model.train()
            while self.step < cfg.max_steps and not self._stop:
                if cfg.max_minutes > 0 and (time.time() - t_start) >= cfg.max_minutes * 60:
                    log.info(f"time budget of {cfg.max_minutes:g} min reached at step {self.step}")
                    break
                self.progress = max(self.progress, step_progress(self.step, cfg))
                if cfg.lr_decay == "budget" and cfg.max_minutes > 0 and self.step >= cfg.warmup_steps:
                    # A resumed run decays the rest of the way within its own time budget.
                    frac = (time.time() - t_start) / (cfg.max_minutes * 60)
                    self.progress = max(self.progress, progress0 + (1 - progress0) * frac)
                lr = lr_at(self.step, cfg, self.progress)
                for g in self.opt.param_groups:
                    g["lr"] = lr
                self.opt.zero_grad(set_to_none=True)
                tot_loss, metrics, ok = 0.0, {}, True
                for _ in range(cfg.grad_accum):
                    with autocast(self.device, cfg.dtype):
                        loss, m, ntok = self.step_fn(self.step)
                    loss = loss / cfg.grad_accum
                    if not torch.isfinite(loss):
                        ok = False
                        break
                    (self.scaler.scale(loss) if self.scaler else loss).backward()
                    tot_loss += float(loss.detach())
                    win_tokens += ntok
                    self.tokens += ntok
                    for k, v in m.items():
                        metrics[k] = metrics.get(k, 0.0) + float(v) / cfg.grad_accum
                if self.scaler:
                    self.scaler.unscale_(self.opt)
                gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip if cfg.clip > 0 else float("inf"))
                if not ok or not torch.isfinite(gnorm):
                    nonfinite += 1
                    self.opt.zero_grad(set_to_none=True)
                    if self.scaler:
                        self.scaler.update()
                    log.warn(f"step {self.step}: non-finite loss or gradient, step skipped")
                    if nonfinite >= 20:
                        self.save_checkpoint()
                        raise TdiffError(
                            f"loss is NaN/inf for {nonfinite} steps in a row at step {self.step}; "
                            "lower --lr, use --dtype fp32, or check the data"
                        )
                    continue
                nonfinite = 0
                if self.scaler:
                    self.scaler.step(self.opt)
                    self.scaler.update()
                else:
                    self.opt.step()
                self.step += 1
                self._update_ema()
                self.elapsed = elapsed0 + time.time() - t_start
                self.last_metrics = {"loss": tot_loss, **metrics}
                if self.step % cfg.log_every == 0 or self.step == 1 or self.step == cfg.max_steps:
                    now = time.time()
                    rec = {"step": self.step, "loss": round(tot_loss, 6), "lr": lr, "grad_norm": round(float(gnorm), 4),
                           "tokens_per_s": round(win_tokens / max(1e-9, now - win_t), 1),
                           "elapsed_s": round(self.elapsed, 2),
                           **{k: round(v, 6) for k, v in metrics.items()}}
                    win_tokens, win_t = 0, now
                    if logf:
                        logf.write(json.dumps(rec) + "\n")
                        logf.flush()
                    extra = " ".join(f"{k} {v:.4g}" for k, v in metrics.items())
                    log.info(f"step {self.step:>6}  loss {tot_loss:.4f}  {extra}  lr {lr:.2e}  "
                             f"{rec['tokens_per_s']:.0f} tok/s  {self.elapsed:.0f}s")
                if cfg.ckpt_every > 0 and self.step % cfg.ckpt_every == 0:
                    self.save_checkpoint()
            self.save_checkpoint()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if logf:
                logf.close()
        return {"steps": self.step, "elapsed_s": round(self.elapsed, 2), "tokens": self.tokens,
                "interrupted": self._stop, **{k: round(v, 6) for k, v in self.last_metrics.items()}}
