"""`tdiff train-vae`: token ids JSONL → vae.safetensors."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tdiff.commands import common
from tdiff.commands import training_options as T
from tdiff.commands.training_options import log_summary


def train_vae(
    ctx: typer.Context,
    input: str = T.input_opt(),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the VAE (safetensors, kind 'vae')."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="SentencePiece model the ids were made with "
                                   "(stored inside the VAE)."),
    preset: str = T.preset_opt(),
    latent_dim: int = typer.Option(32, "--latent-dim", help="Width of each latent vector."),
    latent_stride: int = typer.Option(1, "--latent-stride", help="Tokens pooled into one latent: 1, 2 or 4."),
    max_len: int = typer.Option(0, "--max-len", help="Token positions per sequence (0: 99th percentile of the data)."),
    beta: float = typer.Option(1e-3, "--beta", help="KL weight β after warm-up."),
    kl_warmup: int = typer.Option(500, "--kl-warmup", help="Steps over which β rises linearly from 0."),
    free_bits: float = typer.Option(0.1, "--free-bits", help="KL floor per latent dimension, in nats."),
    batch_size: int = T.batch_size_opt(64),
    lr: float = T.lr_opt(1e-3),
    warmup: int = T.warmup_opt(),
    max_steps: int = T.max_steps_opt(3000),
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
    """Train the text VAE: Transformer encoder to Gaussian latents, non-autoregressive decoder back to tokens.

    Logs progress and a JSON summary (steps, time, held-out reconstruction accuracy) on stderr.
    """
    common.start(ctx)
    from tdiff.device import resolve_device, torch_dtype
    from tdiff.training.loop import LoopConfig
    from tdiff.training.train_vae import VAETrainConfig, train_vae as run

    torch_dtype(dtype)
    loop = LoopConfig(lr=lr, weight_decay=weight_decay, warmup_steps=warmup, max_steps=max_steps,
                      max_minutes=max_minutes, lr_decay=lr_decay, grad_accum=grad_accum, clip=clip, ema_decay=ema, dtype=dtype,
                      seed=seed, log_every=log_every, ckpt_every=ckpt_every)
    tc = VAETrainConfig(preset=preset, latent_dim=latent_dim, latent_stride=latent_stride, max_len=max_len,
                        beta=beta, kl_warmup=kl_warmup, free_bits=free_bits, batch_size=batch_size,
                        holdout=holdout, loop=loop)
    summary = run(input, output, tokenizer, tc, resolve_device(device),
                  T.default_checkpoint(output, checkpoint), log_path=log, resume=resume)
    log_summary(summary)
