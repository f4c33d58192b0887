"""`tdiff train-ar`: token ids JSONL → a GPT-2 transformers directory (the AR baseline and judge)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tdiff.commands import common
from tdiff.commands import training_options as T
from tdiff.commands.training_options import log_summary


def train_ar(
    ctx: typer.Context,
    input: str = T.input_opt(),
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write (config.json, model.safetensors, "
                                "generation_config.json, tok.model, tdiff.json); replaced atomically."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="SentencePiece model the ids were made with "
                                   "(copied into the directory)."),
    preset: str = T.preset_opt(),
    n_layer: int = typer.Option(0, "--n-layer", help="Transformer blocks (0: the preset's: tiny 4, small 6, base 6)."),
    n_embd: int = typer.Option(0, "--n-embd", help="Model width (0: the preset's: tiny 256, small 384, base 512)."),
    n_head: int = typer.Option(0, "--n-head", help="Attention heads, dividing --n-embd (0: the preset's: 4, 6, 8)."),
    dropout: float = typer.Option(0.1, "--dropout", help="Dropout on embeddings, attention and residuals."),
    max_len: int = typer.Option(0, "--max-len", help="Positions per sequence including bos and eos (0: 99th "
                                "percentile of the data + 2, at most 1024); longer sequences are cut."),
    batch_size: int = T.batch_size_opt(32),
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
    """Train a GPT-2 causal LM on the same token ids: the autoregressive baseline and the judge of
    generative perplexity in `tdiff eval`.

    Writes a standard transformers directory (loads with AutoModelForCausalLM.from_pretrained, offline).
    Logs progress and a JSON summary (steps, time, held-out perplexity) on stderr.
    """
    common.start(ctx)
    from tdiff.device import resolve_device, torch_dtype
    from tdiff.training.loop import LoopConfig
    from tdiff.training.train_ar import ARTrainConfig, train_ar as run

    torch_dtype(dtype)
    if output.name in ("", ".."):
        output = output.resolve()          # "-o ." names the directory; its checkpoint goes beside it
    loop = LoopConfig(lr=lr, weight_decay=weight_decay, warmup_steps=warmup, max_steps=max_steps,
                      max_minutes=max_minutes, lr_decay=lr_decay, grad_accum=grad_accum, clip=clip, ema_decay=ema, dtype=dtype,
                      seed=seed, log_every=log_every, ckpt_every=ckpt_every)
    tc = ARTrainConfig(preset=preset, n_layer=n_layer, n_embd=n_embd, n_head=n_head, dropout=dropout,
                       max_len=max_len, batch_size=batch_size, holdout=holdout, loop=loop)
    summary = run(input, output, tokenizer, tc, resolve_device(device),
                  T.default_checkpoint(output, checkpoint), log_path=log, resume=resume)
    log_summary(summary)
