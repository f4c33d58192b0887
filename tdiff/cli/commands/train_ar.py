"""`tdiff train-ar`: token ids JSONL → a GPT-2 transformers directory (the AR baseline and judge)."""

from __future__ import annotations

from pathlib import Path

import typer

from tdiff.cli.commands import common
from tdiff.cli.commands.training_options import TrainingRun, log_summary, training_command


@common.renamed(n_layer=(("--n-layer",), "n_layers"), n_embd=(("--n-embd",), "d_model"),
                n_head=(("--n-head",), "n_heads"))
@training_command(lr=1e-3, max_steps=3000, batch_size=32)
def train_ar(
    ctx: typer.Context,
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write (config.json, model.safetensors, "
                                "generation_config.json, tok.model, tdiff.json); replaced atomically."),
    tokenizer: Path = typer.Option(..., "--tokenizer", "-t", help="SentencePiece model the ids were made with "
                                   "(copied into the directory)."),
    d_model: int = typer.Option(0, "--d-model", min=0, max=4096,
                                help="Model width (0: the preset's: tiny 256, small 384, base 512)."),
    n_layers: int = typer.Option(0, "--n-layers", min=0, max=64,
                                 help="Transformer blocks (0: the preset's: tiny 4, small 6, base 6)."),
    n_heads: int = typer.Option(0, "--n-heads", min=0,
                                help="Attention heads, dividing --d-model (0: the preset's: 4, 6, 8)."),
    dropout: float = typer.Option(0.1, "--dropout", min=0.0, max=0.9, help="Dropout on embeddings, attention and residuals."),
    max_len: int = typer.Option(0, "--max-len", min=0, max=1024,
                                help="The model's window in positions, bos and eos included (0: 99th percentile of "
                                "the data + 2, at most 1024); longer sequences are cut."),
    *,
    run: TrainingRun,
):
    """Train a GPT-2 causal LM on the same token ids: the autoregressive baseline and the judge of
    generative perplexity in `tdiff eval`.

    Writes a standard transformers directory (loads with AutoModelForCausalLM.from_pretrained, offline).
    Logs progress and a JSON summary (steps, time, held-out perplexity) on stderr.
    """
    common.start(ctx)
    from tdiff.core.device import resolve_device
    from tdiff.training.train_ar import ARTrainConfig, train_ar as train

    if output.name in ("", ".."):
        output = output.resolve()          # "-o ." names the directory; its checkpoint goes beside it
    tc = ARTrainConfig(preset=run.preset, n_layer=n_layers, n_embd=d_model, n_head=n_heads, dropout=dropout,
                       max_len=max_len, batch_size=run.batch_size, holdout=run.holdout, loop=run.loop)
    summary = train(run.input, output, tokenizer, tc, resolve_device(run.device), run.checkpoint_for(output),
                    log_path=run.log, resume=run.resume)
    log_summary(summary)
