"""`tdiff train`: token ids JSONL + vae.safetensors → model.safetensors (VAE + DiT + schedule + tokenizer)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tdiff.commands import common
from tdiff.commands import training_options as T
from tdiff.commands.training_options import log_summary


def train(
    ctx: typer.Context,
    input: str = T.input_opt(),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the model (safetensors, kind 'model')."),
    vae: Path = typer.Option(..., "--vae", help="VAE from `tdiff train-vae` (its tokenizer and latent statistics are used)."),
    preset: str = T.preset_opt(),
    schedule: str = typer.Option("cosine", "--schedule", help="Noise schedule: cosine, linear, sqrt or learned."),
    target: str = typer.Option("v", "--target", help="Prediction target: x0, eps or v."),
    self_condition: bool = typer.Option(True, "--self-condition/--no-self-condition",
                                        help="Train with self-conditioning (previous x0 estimate as input, 50% of steps)."),
    cond_prob: float = typer.Option(0.25, "--cond-prob", help="Share of examples trained with a known span "
                                    "(prefix/infill conditioning channel)."),
    batch_size: int = T.batch_size_opt(64),
    lr: float = T.lr_opt(5e-4),
    warmup: int = T.warmup_opt(),
    max_steps: int = T.max_steps_opt(5000),
    max_minutes: float = T.max_minutes_opt(),
    lr_decay: str = T.lr_decay_opt(),
    grad_accum: int = T.grad_accum_opt(),
    clip: float = T.clip_opt(),
    weight_decay: float = T.weight_decay_opt(),
    ema: float = T.ema_opt(),
    holdout: float = T.holdout_opt(),
    device: str = T.device_opt(),
    dtype: str = T.dtype_opt(),
    seed: int = T.seed_opt(),
    log: Optional[Path] = T.log_opt(),
    log_every: int = T.log_every_opt(),
    checkpoint: Optional[Path] = T.checkpoint_opt(),
    ckpt_every: int = T.ckpt_every_opt(),
    resume: bool = T.resume_opt(),
    quiet: bool = common.quiet_option(),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
):
    """Train the DiT denoiser in the VAE's latent space; the output file is self-contained."""
    common.start(ctx)
    from tdiff.device import resolve_device, torch_dtype
    from tdiff.training.loop import LoopConfig
    from tdiff.training.train_dit import DiTTrainConfig, train_dit

    torch_dtype(dtype)
    loop = LoopConfig(lr=lr, weight_decay=weight_decay, warmup_steps=warmup, max_steps=max_steps,
                      max_minutes=max_minutes, lr_decay=lr_decay, grad_accum=grad_accum, clip=clip, ema_decay=ema, dtype=dtype,
                      seed=seed, log_every=log_every, ckpt_every=ckpt_every)
    tc = DiTTrainConfig(preset=preset, schedule=schedule, target=target, self_condition=self_condition,
                        cond_prob=cond_prob, batch_size=batch_size, holdout=holdout, loop=loop)
    summary = train_dit(input, output, vae, tc, resolve_device(device),
                        T.default_checkpoint(output, checkpoint), log_path=log, resume=resume)
    log_summary(summary)
