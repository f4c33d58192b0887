"""`tdiff tokenize`: {"text"} records to {"ids"} records with a SentencePiece model, and back (--decode).

When -t/--tokenizer does not exist it is first trained on the input (a reservoir
sample of --train-sample records), then the same input is encoded. A file
input is simply read twice; stdin is copied to a temporary file while it is
sampled, so memory holds only the sample.

Records are processed in batches of lines; with --jobs N the batches go to N
worker processes (each loads the model once) and come back in input order.
"""

from __future__ import annotations

import os
import tempfile
import time
from enum import Enum
from pathlib import Path
from typing import Optional

import click
import typer

from tdiff.core import log
from tdiff.cli.commands import common
from tdiff.core.errors import NoInputError, UsageError
from tdiff.text.tokenize_stream import run_stream, train_on_input

TRAIN_OPTIONS = ("vocab_size", "model_type", "train_sample", "character_coverage", "seed")


class ModelType(Enum):
    unigram = "unigram"
    bpe = "bpe"


class Pretokenize(Enum):
    none = "none"
    jieba = "jieba"


@common.renamed(model=(("--model", "-m"), "tokenizer"))
def tokenize(
    ctx: typer.Context,
    tokenizer: Optional[Path] = typer.Option(
        None,
        "--tokenizer",
        "-t",
        metavar="FILE",
        help="SentencePiece model file, e.g. tok.model (required). If it does not exist it is trained on "
        "the input first and written with tok.vocab and tok.model.json beside it.",
        dir_okay=False,
    ),
    input: str = typer.Option(
        "-", "--input", "-i", metavar="PATH", help="Input JSONL ('-' = stdin): {\"text\"} records, or {\"ids\"} with --decode."
    ),
    output: str = typer.Option(
        "-", "--output", "-o", metavar="PATH", help="Output JSONL ('-' = stdout); files are written atomically."
    ),
    decode: bool = typer.Option(False, "--decode", "-d", help="Turn {\"ids\"} records back into {\"text\"} records."),
    keep_text: bool = typer.Option(False, "--keep-text", help="Keep the 'text' field next to 'ids' in the output (encoding only)."),
    vocab_size: int = typer.Option(8000, "--vocab-size", metavar="N", min=261, max=1_000_000, help="Training: number of pieces (incl. 4 special and 256 byte pieces)."),
    model_type: ModelType = typer.Option(ModelType.unigram, "--model-type", help="Training: SentencePiece algorithm."),
    pretokenize: Optional[Pretokenize] = typer.Option(
        None,
        "--pretokenize",
        help="Training: 'jieba' keeps pieces inside Chinese words (recorded in tok.model.json, so later runs "
        "need not repeat it). Default: none, or what the model records.",
    ),
    train_sample: int = typer.Option(200000, "--train-sample", metavar="N", min=1, help="Training: at most this many records (reservoir sample)."),
    character_coverage: float = typer.Option(
        0.9995,
        "--character-coverage",
        metavar="X",
        min=0.98,
        max=1.0,
        help="Training: share of characters that get their own piece; the rest use byte pieces.",
    ),
    seed: int = typer.Option(0, "--seed", metavar="N", min=0, max=common.SEED_MAX, help="Training: random seed for the sample and the trainer."),
    jobs: int = typer.Option(1, "--jobs", "-j", metavar="N", min=0, max=1024, help="Worker processes (0 = one per CPU); output order is kept."),
    verbose: bool = typer.Option(False, "--verbose", help="Show SentencePiece's training log and jieba's start-up "
                                 "lines on stderr."),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
    quiet: bool = common.quiet_option(),
):
    """Turn {"text"} JSONL records into {"ids"} records with a SentencePiece model (or back with --decode).

    Trains the model first when -t/--tokenizer does not exist. Other fields pass through.
    """
    common.start(ctx)
    log.set_verbose(verbose)
    model_type = model_type.value
    pretokenize = pretokenize.value if pretokenize is not None else None
    from tdiff.files.streams import display_name, is_std, open_output
    from tdiff.text.tokenizer import Tokenizer
    from tdiff.text.tokenizer_files import meta_path

    if tokenizer is None:
        raise UsageError("-t/--tokenizer is required: the SentencePiece model to use, or to train first when the file "
                         "does not exist (e.g. -t tok.model)")
    if jobs < 0:
        raise UsageError(f"--jobs must be 0 (one per CPU) or more, got {jobs}")
    jobs = jobs or (os.cpu_count() or 1)
    if train_sample < 1:
        raise UsageError(f"--train-sample must be at least 1, got {train_sample}")
    name = display_name(input)
    t0 = time.time()
    tmp_copy: Optional[str] = None
    source = input
    try:
        if tokenizer.exists():
            tok = Tokenizer.load(tokenizer, hint="point -t/--tokenizer at a .model file, or at a missing path to "
                                 "train a new one")
            recorded = tok.meta.get("pretokenize", "none")
            if pretokenize is not None and pretokenize != recorded:
                how = f"recorded in {meta_path(tokenizer)}" if meta_path(tokenizer).exists() else "no tok.model.json beside it"
                raise UsageError(
                    f"--pretokenize {pretokenize} does not match model '{tokenizer}', which uses --pretokenize "
                    f"{recorded} ({how}); drop the option or train a new model"
                )
            if not tok.lossless:
                log.warn(f"'{tokenizer}' lacks byte-fallback or space pieces (not trained by tdiff): "
                         "decode(encode(text)) may differ from the text")
            given = [o for o in TRAIN_OPTIONS if _from_command_line(ctx, o)]
            if given and not decode:
                log.warn(f"'{tokenizer}' exists, so training options are ignored: "
                         + ", ".join("--" + g.replace("_", "-") for g in given))
        elif decode:
            raise NoInputError(f"model '{tokenizer}' does not exist; --decode needs the model the ids were made with (-t/--tokenizer)")
        else:
            if is_std(input):
                fd, tmp_copy = tempfile.mkstemp(prefix="tdiff-tokenize-", suffix=".jsonl")
                os.close(fd)
                source = tmp_copy
            tok = train_on_input(
                input, tmp_copy, name, tokenizer,
                vocab_size=vocab_size, model_type=model_type, pretokenize=pretokenize or "none",
                train_sample=train_sample, character_coverage=character_coverage, seed=seed,
                jobs=jobs, verbose=verbose,
            )
            log.info(f"tokenize: trained {model_type} model '{tokenizer}' ({tok.vocab_size} pieces, "
                     f"pretokenize {tok.meta['pretokenize']}) in {time.time() - t0:.1f} s")
        t1 = time.time()
        with open_output(output) as out:               # a reader that goes away: tdiff.cli.main exits quietly
            stats = run_stream(source, name, out, tok, decode=decode, keep_text=keep_text, jobs=jobs)
    finally:
        if tmp_copy:
            Path(tmp_copy).unlink(missing_ok=True)
    _summary(stats, decode, time.time() - t1)


def _from_command_line(ctx: click.Context, param: str) -> bool:
    src = ctx.get_parameter_source(param)
    return src is not None and src.name == "COMMANDLINE"


# ---------------------------------------------------------------- reading


# ---------------------------------------------------------------- work (main process or workers)


def _summary(stats: dict, decode: bool, seconds: float) -> None:
    r, c, i = stats["records"], stats["chars"], stats["ids"]
    ratio = f", {c / i:.2f} chars/id" if i else ""
    verb = "decoded" if decode else "encoded"
    log.info(f"tokenize: {verb} {r:,} records, {c:,} chars, {i:,} ids{ratio} in {seconds:.1f} s")

