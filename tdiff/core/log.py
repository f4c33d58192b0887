"""Logging and progress on stderr. Stdout carries data only.

Progress bars show only when stderr is a terminal and --quiet is off;
messages honour NO_COLOR (rich does this itself).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

_quiet = False
_verbose = False
_console = None


def set_quiet(quiet: bool) -> None:
    global _quiet
    _quiet = quiet


def set_verbose(verbose: bool) -> None:
    """--verbose: let third-party libraries' own log lines (jieba, SentencePiece) through to stderr."""
    global _verbose
    _verbose = verbose


def is_verbose() -> bool:
    return _verbose and not _quiet


def is_quiet() -> bool:
    return _quiet


def console():
    """The shared rich Console on stderr (created lazily: rich costs import time)."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=True, highlight=False)
    return _console


def info(msg: str) -> None:
    """A progress or summary line on stderr; silenced by --quiet."""
    if not _quiet:
        sys.stderr.write(msg.rstrip("\n") + "\n")
        sys.stderr.flush()


def warn(msg: str) -> None:
    """A warning on stderr; shown even with --quiet."""
    sys.stderr.write("tdiff: warning: " + msg.rstrip("\n") + "\n")
    sys.stderr.flush()


def progress_enabled() -> bool:
    return not _quiet and sys.stderr.isatty()


class _NullProgress:
    def add_task(self, *a, **k):
        return 0

    def update(self, *a, **k):
        pass

    def advance(self, *a, **k):
        pass


@contextmanager
def progress(transient: bool = True):
    """A rich Progress on stderr when enabled (stderr a terminal, no --quiet), otherwise a no-op
    object with the same methods. Give every task a `unit` field (" steps", " records").
    Lines written to stderr meanwhile (`info`) print above the bar."""
    if not progress_enabled():
        yield _NullProgress()
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f}{task.fields[unit]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console(),
        transient=transient,
        redirect_stdout=False,
        redirect_stderr=True,
    ) as p:
        yield p
