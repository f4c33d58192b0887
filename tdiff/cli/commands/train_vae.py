"""`tdiff train-vae`: token ids JSONL → vae.safetensors."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer

from tdiff.core import choices
from tdiff.cli.commands import common
from tdiff.cli.commands.training_options import TrainingRun, log_summary, training_command


@training_command(lr=1e-3, max_steps=3000, batch_size=64)
def train_vae(
    ctx: typer.Context,
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the VAE (safetensors, kind 'vae')."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="SentencePiece model the ids were made with "
                                   "(stored inside the VAE)."),
    latent_dim: int = typer.Option(32, "--latent-dim", min=1, help="Width of each latent vector."),
    latent_stride: Literal[1, 2, 4] = typer.Option(1, "--latent-stride", help="Tokens pooled into one latent."),
    max_len: int = typer.Option(0, "--max-len", min=0, help="The model's window in positions, one token each "
                                "(0: 99th percentile of the data); a multiple of --latent-stride."),
    beta: float = typer.Option(1e-3, "--beta", min=0.0, help="KL weight β after warm-up."),
    kl_warmup: int = typer.Option(500, "--kl-warmup", min=0, help="Steps over which β rises linearly from 0."),
    free_bits: float = typer.Option(0.1, "--free-bits", min=0.0, help="KL floor per latent dimension, in nats."),
    latent_noise: float = typer.Option(0.1, "--latent-noise", min=0.0, max=10.0,
                                       help="Gaussian noise added to the decoder's input in training, relative to "
                                            "each latent channel's spread (makes the decoder robust to the "
                                            "denoiser's errors)."),
    d_model: int = typer.Option(0, "--d-model", min=0, max=4096,
                                help="VAE width (0: the preset's: tiny 128, small 256, base 512)."),
    n_layers: int = typer.Option(0, "--n-layers", min=0, max=64,
                                 help="Encoder and decoder blocks each (0: the preset's: tiny 2, small 4, base 6)."),
    align: Optional[Path] = typer.Option(
        None, "--align", help="A `tdiff train-ar` directory (same tokenizer): align the latents to its "
        "middle-block features through a linear probe, REPA-style (the probe is not saved)."),
    align_weight: float = typer.Option(0.5, "--align-weight", min=0.0, max=100.0,
                                       help="Weight of the alignment loss, 1 − cosine similarity (with --align)."),
    encoder: Optional[Path] = typer.Option(
        None, "--encoder", help="A `tdiff train-ar` directory (same tokenizer): its first half, frozen, reads "
        "the text for the encoder in place of a token embedding (stored inside the VAE)."),
    decoder: Literal[choices.VAE_DECODERS] = typer.Option(
        "parallel", "--decoder", help="Latents to tokens: parallel (every position at once) or contextual (also a "
        "small autoregressive decoder on the parallel one's states, CoDAR: samples decode token by token, "
        "coherent where parallel picks disagree; slower to sample)."),
    ctx_layers: int = typer.Option(2, "--ctx-layers", min=1, max=64,
                                   help="Blocks of the contextual decoder (with --decoder contextual)."),
    *,
    run: TrainingRun,
):
    """Train the text VAE: Transformer encoder to Gaussian latents, non-autoregressive decoder back to tokens
    (with --decoder contextual, an autoregressive one on top of it).

    Logs progress and a JSON summary (steps, time, held-out reconstruction accuracy) on stderr.
    """
    common.start(ctx)
    from tdiff.core import memory
    from tdiff.core.device import resolve_device
    from tdiff.training.train_vae import VAETrainConfig, train_vae as train

    tc = VAETrainConfig(preset=run.preset, latent_dim=latent_dim, latent_stride=latent_stride, max_len=max_len,
                        beta=beta, kl_warmup=kl_warmup, free_bits=free_bits, latent_noise=latent_noise,
                        d_model=d_model, n_layers=n_layers, align=str(align) if align else "",
                        align_weight=align_weight, encoder=str(encoder) if encoder else "", decoder=decoder,
                        ctx_layers=ctx_layers, batch_size=run.batch_size, holdout=run.holdout, loop=run.loop)
    device = resolve_device(run.device)
    _check_memory(tc, tokenizer, device)
    with memory.out_of_memory_errors("try a smaller --batch-size, --max-len or --d-model"):
        summary = train(run.input, output, tokenizer, tc, device, run.checkpoint_for(output),
                        log_path=run.log, resume=run.resume)
    log_summary(summary)


def _check_memory(tc, tokenizer: Path, device) -> None:
    """A usage error before anything is read or built when the VAE of TC cannot train in DEVICE's
    memory (tdiff/core/memory.py). Without --max-len the length is the smallest the data could give
    (8 × --latent-stride), so the estimate stays below the real need."""
    from tdiff.core import memory
    from tdiff.models.vae import PRESETS
    from tdiff.text.tokenizer import Tokenizer

    if tc.preset not in PRESETS:
        return                                           # train_vae names the bad preset
    vocab = Tokenizer.load(tokenizer, option="-t/--tokenizer").vocab_size
    width = tc.d_model or PRESETS[tc.preset]["d_model"]
    depth = tc.n_layers or PRESETS[tc.preset]["n_layers"]
    layers = 2 * depth                                                    # the encoder's and the decoder's
    ctx = tc.ctx_layers if tc.decoder == "contextual" else 0
    passes = layers + (ctx + depth if ctx else 0)     # with a contextual decoder the parallel one runs twice
    length = tc.max_len or 8 * tc.latent_stride
    batch = f"--batch-size {tc.batch_size}" + (f" with --max-len {tc.max_len}" if tc.max_len else "")
    memory.check_training(device, params=memory.transformer_params(width, layers + ctx, memory.VAE_BLOCK, vocab),
                          ema=tc.loop.ema_decay > 0,
                          activations=memory.activation_bytes(tc.batch_size, length, width, passes, training=True,
                                                              vocab=vocab),
                          preset=tc.preset, d_model=tc.d_model, n_layers=tc.n_layers, batch_option=batch)
