"""Reading and writing the files and streams every subcommand uses.

- Text input: stdin or a file, decoded as UTF-8 line by line; invalid bytes are
  replaced and counted, or (strict) reported with the file and line number.
- JSONL input: one object per line; a malformed line is a DataError naming it.
- Output: stdout, or a file written atomically (temp file in the same folder,
  then rename), so an interrupted run never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from tdiff.errors import DataError, NoInputError


def is_std(path) -> bool:
    return path is None or str(path) == "-"


def display_name(path) -> str:
    return "<stdin>" if is_std(path) else str(path)


def open_binary_input(path) -> IO[bytes]:
    """The binary stream for PATH ('-' or None: stdin). Missing file: NoInputError (exit 66)."""
    if is_std(path):
        return sys.stdin.buffer
    p = Path(path)
    if not p.exists():
        raise NoInputError(f"input file '{p}' does not exist (check -i/--input)")
    if p.is_dir():
        raise NoInputError(f"input '{p}' is a directory, not a file")
    return open(p, "rb")


class DecodeStats:
    """Counts of lines whose invalid UTF-8 was replaced with U+FFFD."""

    def __init__(self):
        self.bad_lines = 0
        self.first_bad_line = 0


def iter_lines(path, strict: bool = False, stats: DecodeStats | None = None) -> Iterator[tuple[int, str]]:
    """Yield (line_number, text) for each line of PATH, newline stripped.

    Invalid UTF-8: with strict, a DataError naming the file and line; otherwise the
    bad bytes become U+FFFD and the line is counted in STATS.
    """
    f = open_binary_input(path)
    name = display_name(path)
    try:
        for n, raw in enumerate(f, 1):
            if raw.endswith(b"\n"):
                raw = raw[:-1]
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if strict:
                    raise DataError(
                        f"{name}:{n}: invalid UTF-8 at byte {e.start} (drop --strict to replace bad bytes)"
                    ) from None
                line = raw.decode("utf-8", errors="replace")
                if stats is not None:
                    stats.bad_lines += 1
                    if not stats.first_bad_line:
                        stats.first_bad_line = n
            yield n, line
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def iter_jsonl(path, strict: bool = True, stats: DecodeStats | None = None) -> Iterator[tuple[int, dict]]:
    """Yield (line_number, record) for each non-blank line of a JSONL file or stream."""
    name = display_name(path)
    for n, line in iter_lines(path, strict=strict, stats=stats):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{name}:{n}: malformed JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{name}:{n}: expected a JSON object, got {type(rec).__name__}")
        yield n, rec


def require_field(rec: dict, field: str, kind, name: str, lineno: int):
    """rec[field], checked to be of KIND; a DataError naming file and line otherwise."""
    if field not in rec:
        raise DataError(f"{name}:{lineno}: record has no '{field}' field")
    v = rec[field]
    if not isinstance(v, kind):
        raise DataError(f"{name}:{lineno}: field '{field}' must be {getattr(kind, '__name__', kind)}")
    return v


_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": ")).encode


def dumps(rec: dict) -> str:
    """One JSONL line (UTF-8 text kept readable, no ASCII escapes)."""
    return _ENCODE(rec) + "\n"


@contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path beside PATH; on success it is renamed onto PATH, on failure removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def open_output(path) -> Iterator[IO[str]]:
    """A text stream for PATH: stdout for '-'/None, else an atomically written UTF-8 file."""
    if is_std(path):
        yield sys.stdout
        sys.stdout.flush()
        return
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            yield f


class JsonlWriter:
    """Writes records as JSONL, flushing every FLUSH_EVERY records so pipes stream."""

    def __init__(self, stream: IO[str], flush_every: int = 64):
        self.stream = stream
        self.flush_every = max(1, flush_every)
        self.count = 0

    def write(self, rec: dict) -> None:
        self.stream.write(dumps(rec))
        self.count += 1
        if self.count % self.flush_every == 0:
            self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()
