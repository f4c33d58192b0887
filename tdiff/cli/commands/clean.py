"""`tdiff clean`: raw text (or JSONL) to cleaned `{"text": ...}` records.

A thin layer: parse options, stream records through tdiff.text.clean.Cleaner,
write JSONL, print statistics on stderr.
"""

from __future__ import annotations

import os
import time
from enum import Enum
from pathlib import Path
from typing import Iterator, Optional

import typer

from tdiff.core import log
from tdiff.cli.commands import common
from tdiff.core.errors import UsageError
from tdiff.files.streams import (DecodeStats, JsonlWriter, display_name, is_std, iter_jsonl, iter_lines,
    open_binary_input, open_output, require_field)

_PROGRESS_EVERY = 4096


class Punct(Enum):
    keep = "keep"
    full = "full"
    half = "half"


def _paragraphs(lines: Iterator[tuple[int, str]]) -> Iterator[str]:
    """Blank-line separated blocks of LINES, their lines joined with newlines."""
    block: list[str] = []
    for _, line in lines:
        if line.strip():
            block.append(line)
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


def _jsonl_records(path: str, field: str, strict: bool, stats) -> Iterator[dict]:
    """Records of a JSONL input, each checked to hold a string FIELD."""
    name = display_name(path)
    for n, rec in iter_jsonl(path, strict=strict, stats=stats):
        require_field(rec, field, str, name, n)
        yield rec


def _input_records(path: str, jsonl: bool, paragraphs: bool, field: str, strict: bool, decode) -> Iterator[dict]:
    """The input as records {FIELD: text, ...}: JSONL records, paragraphs or lines."""
    if jsonl:
        return _jsonl_records(path, field, strict, decode)
    lines = iter_lines(path, strict=strict, stats=decode)
    texts = _paragraphs(lines) if paragraphs else (line for _, line in lines)
    return ({field: t} for t in texts)


def _summary(st, bad_lines: int, seconds: float, nbytes: int) -> str:
    mb = nbytes / 1e6
    rate = mb / seconds if seconds > 0 else 0.0
    return (
        f"clean: {st.records_in:,} records in, {st.records_out:,} out; "
        f"{st.chars_in:,} chars in, {st.chars_out:,} out; "
        f"dropped {st.empty:,} empty, {st.short:,} short, {st.duplicates:,} duplicates; "
        f"{st.split:,} split into chunks; {bad_lines:,} lines with invalid UTF-8; "
        f"{mb:.1f} MB in {seconds:.2f} s ({rate:.1f} MB/s)"
    )


class _ByteCount:
    """Counts the UTF-8 bytes of the texts passing through (for stdin, whose size is unknown)."""

    def __init__(self):
        self.n = 0

    def wrap(self, records: Iterator[dict], field: str) -> Iterator[dict]:
        for rec in records:
            self.n += len(rec[field].encode("utf-8", "surrogatepass")) + 1
            yield rec


def _input_bytes(path: str, counted: int) -> int:
    """Bytes read: the file size, or for stdin the UTF-8 size of the texts seen."""
    if not is_std(path):
        try:
            return os.path.getsize(path)
        except OSError:
            pass
    return counted


def _write(cleaner, records: Iterator[dict], field: str, output: str) -> float:
    """Clean RECORDS into OUTPUT as JSONL (progress bar on a terminal); the seconds it took. A reader
    of stdout that goes away (`tdiff clean | head`) ends the command quietly (tdiff.cli.main)."""
    t0 = time.perf_counter()
    with open_output(output) as stream, log.progress() as bar:
        task = bar.add_task("clean", total=None, unit=" records")
        writer = JsonlWriter(stream, flush_every=256)
        for rec in cleaner.records(records, field):
            writer.write(rec)
            if writer.count % _PROGRESS_EVERY == 0:
                bar.update(task, completed=cleaner.stats.records_in)
        writer.flush()
    return time.perf_counter() - t0


def clean(
    ctx: typer.Context,
    input: str = typer.Option("-", "--input", "-i", metavar="PATH", help="Input text or JSONL file ('-': stdin)."),
    output: str = typer.Option(
        "-", "--output", "-o", metavar="PATH", help="Output JSONL file, written atomically ('-': stdout)."
    ),
    paragraphs: bool = typer.Option(
        False, "--paragraphs", help="One record per blank-line separated block (lines joined with newlines)."
    ),
    jsonl: bool = typer.Option(
        False, "--jsonl", help="Input is JSONL: clean the --field of each record, keep the other fields."
    ),
    field: str = typer.Option("text", "--field", metavar="NAME", help="Record field to clean (JSONL) and to write."),
    punct: Punct = typer.Option(
        Punct.keep,
        "--punct",
        help="full: half-width to full-width punctuation in Chinese context; half: full-width to half-width; keep.",
    ),
    protect: bool = typer.Option(
        True,
        "--protect/--no-protect",
        help="Never convert punctuation inside ASCII digit/letter runs (3.14, U.S.A, www.x.com).",
    ),
    max_chars: int = typer.Option(
        0, "--max-chars", min=0, metavar="N", help="Chunks of whole sentences of at most N characters (0: no limit)."
    ),
    min_chars: int = typer.Option(
        0, "--min-chars", min=0, metavar="N", help="Drop texts shorter than N characters after cleaning."
    ),
    dedup: bool = typer.Option(False, "--dedup", help="Drop exact duplicate texts (an 8-byte hash kept per text)."),
    strict: bool = typer.Option(False, "--strict", help="Invalid UTF-8 is an error (exit 65) instead of replaced."),
    config: Optional[Path] = common.config_option(),
    dump_config: bool = common.dump_config_option(),
    quiet: bool = common.quiet_option(),
):
    """Clean raw text into {"text": ...} JSONL records: NFC, control and zero-width
    removal, whitespace collapsing, optional punctuation conversion, sentence-aware
    chunking, length filter and exact de-duplication. Statistics go to stderr."""
    common.start(ctx)
    from tdiff.text.clean import Cleaner  # here, not at the top: keeps `tdiff --help` start-up lean

    if not field:
        raise UsageError("--field must not be empty")
    if jsonl and paragraphs:
        raise UsageError("--paragraphs applies to raw text; drop it when using --jsonl")
    if max_chars and min_chars > max_chars:
        raise UsageError(
            f"--min-chars {min_chars} is larger than --max-chars {max_chars}: every chunk would be dropped"
        )

    if not is_std(input):
        open_binary_input(input).close()  # a missing input is exit 66 before any output exists

    cleaner = Cleaner(punct=punct.value, protect=protect, max_chars=max_chars, min_chars=min_chars, dedup=dedup)
    decode = DecodeStats()
    counter = _ByteCount()
    records = _input_records(input, jsonl, paragraphs, field, strict, decode)
    if is_std(input):
        records = counter.wrap(records, field)

    seconds = _write(cleaner, records, field, output)
    if decode.bad_lines:
        log.warn(
            f"{display_name(input)}: {decode.bad_lines:,} lines with invalid UTF-8 "
            f"(first at line {decode.first_bad_line}); bad bytes replaced with U+FFFD "
            "(use --strict to stop instead)"
        )
    log.info(_summary(cleaner.stats, decode.bad_lines, seconds, _input_bytes(input, counter.n)))
