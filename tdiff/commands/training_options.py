"""Options shared by the training commands (train-vae, train, train-ar), each defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def input_opt():
    return typer.Option("-", "--input", "-i", help="Token ids JSONL ({\"ids\": [...]}) from `tdiff tokenize`; - for stdin.")


def preset_opt(default="tiny"):
    return typer.Option(default, "--preset", help="Size preset: tiny (minutes on a CPU), small, base.")


def lr_opt(default: float):
    return typer.Option(default, "--lr", help="Peak learning rate (AdamW).")


def batch_size_opt(default: int):
    return typer.Option(default, "--batch-size", help="Sequences per micro-batch.")


def grad_accum_opt():
    return typer.Option(1, "--grad-accum", help="Micro-batches accumulated per optimizer step.")


def warmup_opt(default: int = 100):
    return typer.Option(default, "--warmup", help="Learning-rate warm-up steps (then cosine decay).")


def max_steps_opt(default: int):
    return typer.Option(default, "--max-steps", help="Stop after this many optimizer steps.")


def max_minutes_opt():
    return typer.Option(0.0, "--max-minutes", help="Stop after this many minutes (0: no limit); whichever of "
                        "--max-steps and --max-minutes comes first ends training with a final checkpoint.")


def lr_decay_opt():
    return typer.Option("steps", "--lr-decay", help="What the cosine decay runs over: steps (--max-steps only; "
                        "one schedule over many resumed runs, e.g. nightly cron jobs) or budget (whichever of "
                        "--max-steps and --max-minutes ends first; a resumed run finishes the decay in its own "
                        "--max-minutes).")


def clip_opt():
    return typer.Option(1.0, "--clip", help="Gradient-norm clipping threshold (0: off).")


def weight_decay_opt():
    return typer.Option(0.01, "--weight-decay", help="AdamW weight decay (not applied to biases and norms).")


def ema_opt(default: float = 0.999):
    return typer.Option(default, "--ema", help="EMA decay of the saved weights (0: no EMA).")


def holdout_opt():
    return typer.Option(0.02, "--holdout", help="Fraction of records held out for evaluation "
                        "(chosen by a hash of each record, the same in every command).")


def device_opt():
    return typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N (auto: CUDA when available).")


def dtype_opt(default: str = "fp32"):
    return typer.Option(default, "--dtype", help="fp32, bf16 or fp16 (autocast; fp16 on CUDA only).")


def seed_opt():
    return typer.Option(0, "--seed", help="Random seed (same seed, device and dtype: same result).")


def log_opt():
    return typer.Option(None, "--log", help="Append metrics as JSONL to this file (step, loss, lr, grad_norm, tokens_per_s).")


def log_every_opt():
    return typer.Option(50, "--log-every", help="Log metrics every N steps.")


def checkpoint_opt():
    return typer.Option(None, "--checkpoint", help="Training checkpoint file (default: OUTPUT with suffix "
                        ".ckpt.safetensors); written atomically every --ckpt-every steps and at the end.")


def ckpt_every_opt():
    return typer.Option(500, "--ckpt-every", help="Write the training checkpoint every N steps (0: only at the end).")


def resume_opt():
    return typer.Option(False, "--resume", help="Continue from the training checkpoint if it exists.")


def default_checkpoint(output: Path, checkpoint: Optional[Path]) -> Path:
    if checkpoint is not None:
        return checkpoint
    name = output.name[: -len(".safetensors")] if output.name.endswith(".safetensors") else output.name
    return output.with_name(name + ".ckpt.safetensors")


def log_summary(summary: dict) -> None:
    """The end-of-run summary as one JSON line on stderr (stdout carries data only)."""
    import json

    from tdiff import log

    log.info("summary " + json.dumps(summary, ensure_ascii=False))
