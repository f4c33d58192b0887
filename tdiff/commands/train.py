"""`tdiff train`: token ids JSONL + vae.safetensors → model.safetensors (VAE + DiT + schedule + tokenizer)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from tdiff import choices
from tdiff.commands import common
from tdiff.commands.training_options import TrainingRun, log_summary, training_command


@training_command(lr=5e-4, max_steps=5000, batch_size=64)
def train(
    ctx: typer.Context,
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the model (safetensors, kind 'model')."),
    vae: Path = typer.Option(..., "--vae", help="VAE from `tdiff train-vae` (its tokenizer and latent statistics are used)."),
    schedule: Literal[choices.SCHEDULES] = typer.Option("cosine", "--schedule", help="Noise schedule."),
    target: Literal[choices.TARGETS] = typer.Option("v", "--target", help="Prediction target."),
    self_condition: bool = typer.Option(True, "--self-condition/--no-self-condition",
                                        help="Train with self-conditioning (previous x0 estimate as input, 50% of steps)."),
    cond_prob: float = typer.Option(0.25, "--cond-prob", min=0.0, max=1.0,
                                    help="Share of examples trained with known spans (a prompt, the text around "
                                         "a hole, a known span, or a fixed length): what `sample --prompt/--infill/"
                                         "--edit/--length` use (0: none of these)."),
    label_field: str = typer.Option("", "--label-field", help="Train a label-conditional model on this JSONL "
                                    "field of every record (e.g. label); `sample --label L --guidance W` steers by it."),
    label_dropout: float = typer.Option(0.1, "--label-dropout", min=0.0, max=1.0,
                                        help="With --label-field: share of rows shown the null label "
                                             "(what classifier-free guidance contrasts with)."),
    t_sampling: Literal[choices.T_SAMPLINGS] = typer.Option(
        "adaptive", "--t-sampling", help="How training draws noise levels: adaptive (time warping: density ∝ "
        "how fast the denoiser's x0 error grows with t, where tokens are decided), or uniform in t."),
    decoder_ce: float = typer.Option(0.0, "--decoder-ce", min=0.0, max=100.0,
                                     help="Weight of the frozen VAE decoder's token cross-entropy on the "
                                          "denoiser's x0 estimate, added to the latent MSE (0: off)."),
    d_model: int = typer.Option(0, "--d-model", min=0, max=4096,
                                help="Denoiser width (0: the preset's: tiny 128, small 256, base 512)."),
    n_layers: int = typer.Option(0, "--n-layers", min=0, max=64,
                                 help="Denoiser blocks (0: the preset's: tiny 4, small 6, base 8)."),
    *,
    run: TrainingRun,
):
    """Train the DiT denoiser in the VAE's latent space; the output file is self-contained."""
    common.start(ctx)
    from tdiff.device import resolve_device
    from tdiff.training.train_dit import DiTTrainConfig, train_dit

    tc = DiTTrainConfig(preset=run.preset, schedule=schedule, target=target, self_condition=self_condition,
                        cond_prob=cond_prob, label_field=label_field, label_dropout=label_dropout, t_sampling=t_sampling, decoder_ce=decoder_ce, d_model=d_model,
                        n_layers=n_layers, batch_size=run.batch_size, holdout=run.holdout, loop=run.loop)
    summary = train_dit(run.input, output, vae, tc, resolve_device(run.device), run.checkpoint_for(output),
                        log_path=run.log, resume=run.resume)
    log_summary(summary)
