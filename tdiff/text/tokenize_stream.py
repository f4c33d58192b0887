"""Encode {"text"} JSONL records to {"ids"} records with a SentencePiece model, or decode them back,
as a stream: records are processed in batches of lines; with JOBS > 1 the batches go to worker
processes (each loads the model once, `tdiff.core.workers.ordered_map`) and come back in input order.
Also: training a model on a reservoir sample of a JSONL input (stdin copied aside as it is read, so
memory holds only the sample). `tdiff tokenize` is option checks around these.
"""

from __future__ import annotations

import os
import sys
from contextlib import closing
from typing import IO, Iterator, Optional

from tdiff.core import log
from tdiff.core.errors import DataError
from tdiff.files.streams import chomp, parse_json

BATCH_LINES = 1000
BATCH_BYTES = 1 << 20


def _open_source(path) -> IO[bytes]:
    from tdiff.files.streams import open_binary_input

    return open_binary_input(path)


def parse_line(raw: bytes, n: int, name: str) -> Optional[dict]:
    """The JSON object on one raw line (None for a blank line); DataError naming NAME:N otherwise."""
    try:
        line = chomp(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{name}:{n}: invalid UTF-8 at byte {e.start} (JSONL must be UTF-8; tdiff clean repairs text)") from None
    if not line.strip():
        return None
    return parse_json(line, n, name)


def text_of(rec: dict, n: int, name: str) -> str:
    t = rec.get("text")
    if not isinstance(t, str):
        if "text" not in rec:
            hint = " (these are token records: add --decode)" if "ids" in rec else ""
            raise DataError(f"{name}:{n}: record has no 'text' field{hint}")
        raise DataError(f"{name}:{n}: field 'text' must be a string, got {type(t).__name__}")
    return t


def train_on_input(input, copy_to, name, model, *, train_sample, seed, jobs, verbose, **opts):
    """Reservoir-sample the input's texts (copying stdin to COPY_TO on the way) and train MODEL."""
    from tdiff.text.tokenizer_train import reservoir_sample, train

    src = _open_source(input)
    copy = open(copy_to, "wb") if copy_to else None

    def texts() -> Iterator[str]:
        for n, raw in enumerate(src, 1):
            if copy is not None:
                copy.write(raw)
            rec = parse_line(raw, n, name)
            if rec is not None:
                yield text_of(rec, n, name)

    try:
        sample, count = reservoir_sample(texts(), train_sample, seed)
    finally:
        if copy is not None:
            copy.close()
        if src is not sys.stdin.buffer:
            src.close()
    if count == 0:
        raise DataError(f"{name} has no records: nothing to train '{model}' on; give text records or an existing -t/--tokenizer model")
    log.info(f"tokenize: training on {len(sample):,} of {count:,} records"
             + (" (jieba pre-tokenization)" if opts.get("pretokenize") == "jieba" else ""))
    with log.progress() as bar:
        bar.add_task(f"train tokenizer on {len(sample):,} texts", total=None, unit="")
        return train(sample, model, seed=seed, jobs=jobs, verbose=verbose, **opts)


def _chunks(path) -> Iterator[tuple[int, list[bytes]]]:
    """(first line number, raw lines) batches of at most BATCH_LINES lines / BATCH_BYTES bytes."""
    f = _open_source(path)
    try:
        lines: list[bytes] = []
        size = 0
        start = 1
        for n, raw in enumerate(f, 1):
            lines.append(raw)
            size += len(raw)
            if len(lines) >= BATCH_LINES or size >= BATCH_BYTES:
                yield start, lines
                lines, size, start = [], 0, n + 1
        if lines:
            yield start, lines
    finally:
        if f is not sys.stdin.buffer:
            f.close()


_state: dict = {}


def _init_worker(model_bytes: bytes, meta: dict, name: str, decode: bool, keep_text: bool, threads: int,
                 quiet: bool = True) -> None:
    from tdiff.text.pretokenize import init_jieba
    from tdiff.text.tokenizer import Tokenizer

    tok = Tokenizer.from_bytes(model_bytes, meta, num_threads=threads)
    if tok.pretokenize == "jieba" and not decode:
        init_jieba(quiet=quiet)
    _state.update(tok=tok, name=name, decode=decode, keep_text=keep_text)


def _work(chunk: tuple[int, list[bytes]]) -> tuple[str, int, int, int]:
    """Encode or decode one batch: (JSONL text, records, characters, ids)."""
    from tdiff.files.streams import dumps

    start, lines = chunk
    tok, name, keep_text = _state["tok"], _state["name"], _state["keep_text"]
    recs: list[dict] = []
    nums: list[int] = []
    for k, raw in enumerate(lines):
        rec = parse_line(raw, start + k, name)
        if rec is not None:
            recs.append(rec)
            nums.append(start + k)
    out: list[str] = []
    n_chars = n_ids = 0
    if _state["decode"]:
        for rec, n in zip(recs, nums):
            if "ids" not in rec:
                hint = " (these are text records: drop --decode)" if "text" in rec else ""
                raise DataError(f"{name}:{n}: record has no 'ids' field{hint}")
            ids = rec["ids"]
            problem = tok.check_ids(ids)
            if problem:
                raise DataError(f"{name}:{n}: {problem}")
            text = tok.decode_bytes(ids).decode("utf-8", errors="ignore")  # ids are checked just above
            n_chars += len(text)
            n_ids += len(ids)
            o = {}
            for key, v in rec.items():
                if key == "ids":
                    o["text"] = text
                elif key != "text":
                    o[key] = v
            out.append(dumps(o))
    else:
        texts = [text_of(rec, n, name) for rec, n in zip(recs, nums)]
        for rec, ids in zip(recs, tok.encode_batch(texts)):
            n_ids += len(ids)
            o = {}
            for key, v in rec.items():
                if key == "text":
                    if keep_text:
                        o["text"] = v
                    o["ids"] = ids
                elif key != "ids":
                    o[key] = v
            out.append(dumps(o))
        n_chars = sum(map(len, texts))
    return "".join(out), len(recs), n_chars, n_ids


def run_stream(source, name: str, out: IO[str], tok, *, decode: bool, keep_text: bool, jobs: int) -> dict:
    stats = {"records": 0, "chars": 0, "ids": 0}

    def emit(res) -> None:
        text, n_rec, n_chars, n_ids = res
        if text:
            out.write(text)
            out.flush()
        stats["records"] += n_rec
        stats["chars"] += n_chars
        stats["ids"] += n_ids
        bar.advance(task, n_rec)

    with log.progress() as bar:
        task = bar.add_task("decode" if decode else "encode", total=None, unit=" records")
        if jobs <= 1:
            _init_worker(tok.to_bytes(), tok.meta, name, decode, keep_text, os.cpu_count() or 1, not log.is_verbose())
            for chunk in _chunks(source):
                emit(_work(chunk))
            return stats
        from tdiff.text.pretokenize import init_jieba
        from tdiff.core.workers import ordered_map, pool_context

        if tok.pretokenize == "jieba" and not decode and pool_context().get_start_method() == "fork":
            init_jieba()  # once here; forked workers inherit the loaded dictionary
        args = (tok.to_bytes(), tok.meta, name, decode, keep_text, 1, True)
        # ordered_map, not multiprocessing.Pool: a Pool can hang for ever in terminate() after
        # SIGTERM (a shared lock left held by a dead worker); these workers are always killable.
        with closing(ordered_map(_work, _chunks(source), jobs, initializer=_init_worker, initargs=args)) as results:
            for res in results:
                emit(res)
    return stats
