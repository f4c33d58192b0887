"""The shared training loop's learning-rate schedule under step and time budgets."""

from __future__ import annotations

import json
import math
import time

import pytest

torch = pytest.importorskip("torch")

from tdiff.training.loop import LoopConfig, Trainer, lr_at, step_progress  # noqa: E402


def test_lr_schedule_by_steps():
    cfg = LoopConfig(lr=1e-3, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4)                 # warm-up: (step+1)/warmup
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(10, cfg) == pytest.approx(1e-3)                # decay starts at the peak
    assert lr_at(60, cfg) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))   # half way: cos(π/2) = 0
    assert lr_at(110, cfg) == pytest.approx(1e-4)               # floor at max_steps
    assert step_progress(60, cfg) == pytest.approx(0.5)


def test_lr_schedule_by_progress():
    cfg = LoopConfig(lr=2e-3, warmup_steps=5, max_steps=10**6, min_lr_ratio=0.1)
    assert lr_at(100, cfg, 1.0) == pytest.approx(2e-4)
    assert lr_at(100, cfg, 0.25) == pytest.approx(2e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))))
    assert lr_at(2, cfg, 1.0) == pytest.approx(2e-3 * 3 / 5)    # warm-up is by steps whatever the progress


def _toy_trainer(tmp_path, max_minutes, max_steps=10**6, ckpt=None, lr_decay="budget"):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    x, y = torch.randn(32, 4), torch.randn(32, 1)

    def step_fn(step, micro):
        time.sleep(0.01)
        return torch.nn.functional.mse_loss(model(x), y), {}, 32

    cfg = LoopConfig(lr=1e-2, warmup_steps=2, max_steps=max_steps, max_minutes=max_minutes,
                     min_lr_ratio=0.1, log_every=1, ckpt_every=0, ema_decay=0, lr_decay=lr_decay)
    return Trainer(model, step_fn, cfg, torch.device("cpu"), ckpt_path=ckpt, log_path=tmp_path / "m.jsonl")


def test_time_budget_decays_lr_to_floor(tmp_path):
    """With a step budget far out of reach, the time budget drives the cosine decay to its floor."""
    tr = _toy_trainer(tmp_path, max_minutes=1.5 / 60)
    tr.run()
    lrs = [json.loads(line)["lr"] for line in open(tmp_path / "m.jsonl")]
    assert len(lrs) > 20
    assert lrs[-1] < 1e-2 * 0.2                                  # near the floor of 1e-3 at the end
    assert all(b <= a + 1e-12 for a, b in zip(lrs[2:], lrs[3:]))  # monotone after warm-up
    assert tr.progress > 0.9


def test_resumed_time_budget_continues_the_decay(tmp_path):
    ck = tmp_path / "ck.safetensors"
    tr = _toy_trainer(tmp_path, max_minutes=0.5 / 60, ckpt=ck)
    tr.run()
    p0 = tr.progress
    assert 0.5 < p0 <= 1.0
    tr2 = _toy_trainer(tmp_path, max_minutes=0.5 / 60, ckpt=ck)
    assert tr2.resume() and tr2.progress == pytest.approx(p0)
    first_step = tr2.step
    tr2.run()
    lrs = [json.loads(line) for line in open(tmp_path / "m.jsonl")]
    resumed = [r["lr"] for r in lrs if r["step"] > first_step]
    assert resumed and max(resumed) <= lr_at(10**6, tr2.cfg, p0) + 1e-12   # no restart of the schedule


def test_lr_decay_steps_ignores_the_clock(tmp_path):
    """--lr-decay steps: a run stopped by the clock ends near its peak rate (one schedule over many runs)."""
    assert LoopConfig().lr_decay == "budget"                    # the default anneals over the time budget
    tr = _toy_trainer(tmp_path, max_minutes=1.0 / 60, lr_decay="steps")
    tr.run()
    lrs = [json.loads(line)["lr"] for line in open(tmp_path / "m.jsonl")]
    assert lrs[-1] > 1e-2 * 0.99


def test_lr_decay_bad_value_is_a_usage_error(tmp_path):
    from tdiff.core.errors import UsageError

    with pytest.raises(UsageError, match="--lr-decay"):
        Trainer(torch.nn.Linear(2, 1), None, LoopConfig(lr_decay="linear"), torch.device("cpu"))
