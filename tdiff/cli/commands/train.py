"""`tdiff train`: token ids JSONL + vae.safetensors → model.safetensors (VAE + DiT + schedule + tokenizer)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import typer

from tdiff.core import choices
from tdiff.cli.commands import common
from tdiff.cli.commands.training_options import TrainingRun, log_summary, training_command


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
    block_size: int = typer.Option(0, "--block-size", min=0, max=65536,
                                   help="Block-causal diffusion: latent positions per block (each block noised "
                                        "at its own level, attending to the clean blocks before it; `sample` "
                                        "generates block by block). 0 or the VAE's window: one parallel block."),
    *,
    run: TrainingRun,
):
    """Train the DiT denoiser in the VAE's latent space; the output file is self-contained."""
    common.start(ctx)
    from tdiff.core import memory
    from tdiff.core.device import resolve_device
    from tdiff.training.train_dit import DiTTrainConfig, train_dit

    tc = DiTTrainConfig(preset=run.preset, schedule=schedule, target=target, self_condition=self_condition,
                        cond_prob=cond_prob, label_field=label_field, label_dropout=label_dropout, t_sampling=t_sampling, decoder_ce=decoder_ce, d_model=d_model,
                        n_layers=n_layers, block_size=block_size, batch_size=run.batch_size, holdout=run.holdout, loop=run.loop)
    device = resolve_device(run.device)
    _check_memory(tc, vae, device)
    with memory.out_of_memory_errors("try a smaller --batch-size or --d-model"):
        summary = train_dit(run.input, output, vae, tc, device, run.checkpoint_for(output),
                            log_path=run.log, resume=run.resume)
    log_summary(summary)


def _check_memory(tc, vae: Path, device) -> None:
    """A usage error before anything is read or built when the denoiser of TC cannot train in DEVICE's
    memory (tdiff/core/memory.py): its parameters, and its activations over the VAE's latent sequence (with
    --decoder-ce, the frozen decoder's too). A --vae that cannot be read is left to train_dit to report."""
    import json

    from tdiff.core import memory
    from tdiff.files.artifacts import read_metadata
    from tdiff.core.errors import TdiffError
    from tdiff.models.dit import PRESETS

    from tdiff.formats.model import vae_config

    try:
        config = json.loads(read_metadata(vae)["config"])
        v = vae_config(vae, config) if isinstance(config, dict) else None      # the validated fields
    except (TdiffError, ValueError, KeyError):
        return                                           # train_dit reports the bad file
    if v is None:
        return
    length, stride, vae_width, vocab = v.max_len, v.latent_stride, v.d_model, v.vocab_size
    decoder_layers = v.n_dec_layers or v.n_layers
    if tc.preset not in PRESETS:
        return                                           # train_dit names the bad preset
    width = tc.d_model or PRESETS[tc.preset]["d_model"]
    layers = tc.n_layers or PRESETS[tc.preset]["n_layers"]
    n_lat = length // stride
    blocks = 0 < tc.block_size < n_lat                  # block-causal training runs [x_t ; x0]: twice the positions
    acts = memory.activation_bytes(tc.batch_size, n_lat * (2 if blocks else 1), width, layers, training=True)
    if tc.decoder_ce > 0:
        acts += memory.activation_bytes(tc.batch_size, length, vae_width, decoder_layers, training=True,
                                        vocab=vocab)
    memory.check_training(device, params=memory.transformer_params(width, layers, memory.DIT_BLOCK),
                          ema=tc.loop.ema_decay > 0, activations=acts, preset=tc.preset, d_model=tc.d_model,
                          n_layers=tc.n_layers, batch_option=f"--batch-size {tc.batch_size}")
