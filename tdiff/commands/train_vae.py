"""`tdiff train-vae`: token ids JSONL → vae.safetensors."""

from __future__ import annotations

from pathlib import Path

import typer

from tdiff.commands import common
from tdiff.commands.training_options import TrainingRun, log_summary, training_command


@training_command(lr=1e-3, max_steps=3000, batch_size=64)
def train_vae(
    ctx: typer.Context,
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the VAE (safetensors, kind 'vae')."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="SentencePiece model the ids were made with "
                                   "(stored inside the VAE)."),
    latent_dim: int = typer.Option(32, "--latent-dim", min=1, help="Width of each latent vector."),
    latent_stride: int = typer.Option(1, "--latent-stride", help="Tokens pooled into one latent: 1, 2 or 4."),
    max_len: int = typer.Option(0, "--max-len", min=0, help="Token positions per sequence (0: 99th percentile of the data)."),
    beta: float = typer.Option(1e-3, "--beta", min=0.0, help="KL weight β after warm-up."),
    kl_warmup: int = typer.Option(500, "--kl-warmup", min=0, help="Steps over which β rises linearly from 0."),
    free_bits: float = typer.Option(0.1, "--free-bits", min=0.0, help="KL floor per latent dimension, in nats."),
    *,
    run: TrainingRun,
):
    """Train the text VAE: Transformer encoder to Gaussian latents, non-autoregressive decoder back to tokens.

    Logs progress and a JSON summary (steps, time, held-out reconstruction accuracy) on stderr.
    """
    common.start(ctx)
    from tdiff.device import resolve_device
    from tdiff.training.train_vae import VAETrainConfig, train_vae as train

    tc = VAETrainConfig(preset=run.preset, latent_dim=latent_dim, latent_stride=latent_stride, max_len=max_len,
                        beta=beta, kl_warmup=kl_warmup, free_bits=free_bits, batch_size=run.batch_size,
                        holdout=run.holdout, loop=run.loop)
    summary = train(run.input, output, tokenizer, tc, resolve_device(run.device), run.checkpoint_for(output),
                    log_path=run.log, resume=run.resume)
    log_summary(summary)
