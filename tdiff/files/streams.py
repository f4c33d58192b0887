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
import re
import shutil
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from tdiff.core.errors import DataError, NoInputError, OutputError, UsageError


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


def chomp(raw: bytes) -> bytes:
    """RAW without its line ending (\n or \r\n)."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
    return raw


def iter_lines(path, strict: bool = False, stats: DecodeStats | None = None) -> Iterator[tuple[int, str]]:
    """Yield (line_number, text) for each line of PATH, newline stripped.

    Invalid UTF-8: with strict, a DataError naming the file and line; otherwise the
    bad bytes become U+FFFD and the line is counted in STATS.
    """
    f = open_binary_input(path)
    name = display_name(path)
    try:
        for n, raw in enumerate(f, 1):
            raw = chomp(raw)
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
        yield n, parse_json(line, n, name, strict, stats)


def parse_json(line: str, n: int, name: str, strict: bool = True, stats: DecodeStats | None = None) -> dict:
    """The JSON object on line N of NAME; DataError naming NAME:N for malformed JSON, a non-object,
    nesting too deep or numbers too long to read. A lone surrogate escape (\\ud800 alone: not
    valid Unicode) is an error when STRICT, else replaced by U+FFFD and counted in STATS."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{name}:{n}: malformed JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise DataError(f"{name}:{n}: JSON nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise DataError(f"{name}:{n}: unreadable JSON ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(rec, dict):
        raise DataError(f"{name}:{n}: expected a JSON object, got {type(rec).__name__}")
    if "\\u" in line:  # only a \u escape can make a lone surrogate (not valid Unicode)
        fixed = _repair_surrogates(line)
        if fixed is not line:
            if strict:
                raise DataError(f"{name}:{n}: a string holds a lone surrogate escape (\\ud800–\\udfff), "
                                "which is not valid Unicode")
            rec = json.loads(fixed)
            if stats is not None:
                stats.bad_lines += 1
                stats.first_bad_line = stats.first_bad_line or n
    return rec


# Every escape of a JSON text, as one unit, so that "\\\\ud800" (an escaped backslash, then text) is
# not taken for an escape: a surrogate pair, a lone surrogate, or any other escape.
_ESCAPE = re.compile(r"(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                     r"|(\\u[dD][89a-fA-F][0-9a-fA-F]{2})|\\u[0-9a-fA-F]{4}|\\.")


def _repair_surrogates(line: str) -> str:
    """The JSON text LINE with every lone surrogate escape (\\ud800–\\udfff not in a valid pair)
    written as \\ufffd; LINE itself when it has none. Works on the text, not the parsed value, so
    nesting depth costs nothing (no recursion)."""
    found = False

    def fix(m):
        nonlocal found
        if m.group(2) is None:
            return m.group(0)
        found = True
        return "\\ufffd"

    fixed = _ESCAPE.sub(fix, line)
    return fixed if found else line


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


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _write_target(path, option: str = "-o/--output") -> Path:
    """Where writing PATH really goes: a symlink's final target (the link itself stays).
    A dangling or looping symlink is an OutputError (exit 73): nothing to write through to."""
    path = Path(path)
    if not path.is_symlink():
        return path
    try:
        return Path(os.path.realpath(path, strict=True))
    except (OSError, RuntimeError):
        raise OutputError(f"{option} '{path}' is a symlink that leads nowhere (dangling, or a loop); "
                          "remove it or give another name") from None


def _is_special(path: Path) -> bool:
    """An existing output that is not a regular file (a device, FIFO or socket): written through."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_stale_temps(path) -> int:
    """Remove temp files of PATH's earlier writes whose process is gone (killed with -9, say).

    Temp names are `.NAME.PID.<random suffix>.tmp` (a file, or a folder for `train-ar`'s directory); a
    temp whose PID no longer runs is stale. Returns how many were removed."""
    path = _write_target(path)
    removed = 0
    try:
        names = os.listdir(path.parent)
    except OSError:
        return 0
    prefix = _temp_prefix(path)
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        stale = path.parent / name
        try:
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
            else:
                stale.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def check_output(path, option: str = "-o/--output", directory: bool = False) -> None:
    """Fail before any work when PATH cannot be written: OutputError (exit 73) naming OPTION.

    A directory (for a file output), a regular file (for a DIRECTORY output), a read-only
    folder, a dangling or looping symlink, or a place no file can be made (/proc/x, under a
    file) are refused; a device or FIFO is fine (written through); stdout ('-') is always fine.
    Nothing is created: missing parent folders are made only when the output is written.
    Stale temp files of PATH are removed."""
    if is_std(path):
        return
    target = _write_target(path, option)
    if directory:
        if target.exists() and not target.is_dir():
            raise OutputError(f"{option} '{path}' exists and is not a directory")
    elif target.is_dir():
        raise OutputError(f"{option} '{path}' is a directory; give a file name")
    elif _is_special(target):
        return
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent                 # the nearest folder that exists: probe there
    if not parent.is_dir():
        raise OutputError(f"{option} '{path}': cannot write there ('{parent}' is not a directory)")
    try:
        fd, probe = tempfile.mkstemp(prefix=f"{_temp_prefix(target)}{os.getpid()}.", suffix=".tmp", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OutputError(f"{option} '{path}': cannot write there ({e.strerror or e})") from None
    if parent == target.parent:
        remove_stale_temps(target)


def same_file(a, b) -> bool:
    """True when paths A and B name one file: the same inode (hard links, symlinks, ./x and x), or, for
    a file that does not exist yet, the same resolved path. stdin/stdout ('-') is never the same file."""
    if is_std(a) or is_std(b):
        return False
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)
    if not stat.S_ISREG(sa.st_mode) and not stat.S_ISDIR(sa.st_mode):
        return False                       # /dev/null as two outputs is fine
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def refuse_same_file(inputs: dict, outputs: dict) -> None:
    """UsageError (exit 2) naming both options when an output would overwrite an input or another
    output. INPUTS and OUTPUTS map an option's name ('-m/--model') to its path (None: not given).
    Called before any work, so nothing is written."""
    outs = [(o, p) for o, p in outputs.items() if p is not None and not is_std(p)]
    ins = [(o, p) for o, p in inputs.items() if p is not None and not is_std(p)]
    for i, (oo, op) in enumerate(outs):
        for io_, ip in ins + outs[:i]:
            if same_file(op, ip):
                raise UsageError(f"{oo} '{op}' is the same file as {io_} '{ip}'; "
                                 "writing it would destroy it (choose another name)")


@contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a path to write PATH's new content to.

    A regular file (or a new one) is written to a temp file beside it, which replaces PATH on
    success and is removed on failure, so an interrupted run never leaves a half-written file.
    A symlink is followed: its target is replaced, the link stays. A device or FIFO (-o
    /dev/null, a named pipe) is written in place: there is nothing to replace atomically; a
    writer must then write the path itself (no temp file of its own). A file that is rewritten
    keeps its mode (a 0600 file stays 0600); a new file gets the mode the user's umask gives."""
    target = _write_target(path)
    if target.is_dir():
        raise OutputError(f"output '{path}' is a directory; give a file name")
    if _is_special(target):
        try:
            yield target
        except OSError as e:
            if e.filename is None and e.errno is not None:
                raise OSError(e.errno, e.strerror, str(path)) from None     # name the device in the error
            raise
        return
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)    # a file being rewritten keeps its mode
    except OSError:
        mode = 0o666 & ~_umask()                         # a new file: what the umask gives
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{_temp_prefix(target)}{os.getpid()}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, mode)               # after writing: a writer may recreate the file (0600)
        os.replace(tmp, target)
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


def file_sha256(path) -> str:
    """Hex SHA-256 of the file at PATH (read in 1 MiB blocks)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
