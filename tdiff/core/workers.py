"""Ordered parallel map over worker processes that can always be stopped.

`multiprocessing.Pool` shares one lock between its workers for reading tasks; an idle worker
holds it while it waits. If a worker dies at the wrong moment (a signal, the OOM killer),
`Pool.terminate()` — run by its context manager and again at interpreter exit — blocks
forever on that lock: `tokenize -j 2` hung after SIGTERM in 2 runs of 10 (issue 10).

Here each worker has a pipe of its own and at most one item in flight, so nothing is shared
and nothing can be left locked: stopping is SIGKILL and join, whatever state a worker is in.
Results come back in input order; an exception raised by FN in a worker is re-raised in the
parent, and a worker that dies is reported as an error instead of a hang.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Iterator, Sequence

from tdiff.core.errors import TdiffError

_END = object()


def pool_context():
    """fork where it exists (workers inherit loaded models and jieba), else spawn."""
    import multiprocessing as mp

    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


def worker_signals() -> None:
    """Default signal handling in a worker.

    A forked worker inherits the parent's SIGTERM handler (tdiff.cli raises an exception there
    so that temp files are removed); a worker stopped with SIGTERM would print a traceback from
    it. Workers die quietly instead, and leave Ctrl-C to the parent, which stops them."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class WorkerDied(TdiffError):
    """A worker process ended without answering (killed from outside, or out of memory): exit 1."""


def _serve(conn, fn: Callable, initializer: Callable | None, initargs: Sequence) -> None:
    """Worker main loop: receive an item, answer ("ok", result) or ("err", exception)."""
    worker_signals()
    failed: BaseException | None = None
    if initializer is not None:
        try:
            initializer(*initargs)
        except BaseException as e:  # reported with the first answer, in the parent
            failed = e
    while True:
        try:
            item = conn.recv()
        except (EOFError, OSError):  # the parent closed its end: done
            return
        if failed is not None:
            reply = ("err", failed)
        else:
            try:
                reply = ("ok", fn(item))
            except BaseException as e:
                reply = ("err", e)
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable exception or result
            conn.send(("err", RuntimeError(f"worker could not send its answer: {e}")))


def ordered_map(fn: Callable[[Any], Any], items: Iterable, jobs: int, *,
                initializer: Callable | None = None, initargs: Sequence = ()) -> Iterator:
    """FN(item) for each item, computed in JOBS worker processes, yielded in input order.

    Items are read lazily (at most JOBS in flight), so memory stays flat on endless input.
    Closing the generator, or any exception in the parent (KeyboardInterrupt, SIGTERM turned
    into an exception), kills the workers at once."""
    ctx = pool_context()
    workers: list = []
    try:
        for _ in range(max(1, jobs)):
            mine, theirs = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_serve, args=(theirs, fn, initializer, tuple(initargs)), daemon=True)
            p.start()
            theirs.close()
            workers.append((p, mine))
        source = iter(items)
        busy: deque[int] = deque()  # worker indices, in the order their items were read
        for i, (_, conn) in enumerate(workers):
            item = next(source, _END)
            if item is _END:
                break
            conn.send(item)
            busy.append(i)
        while busy:
            i = busy.popleft()
            proc, conn = workers[i]
            try:
                status, value = conn.recv()
            except (EOFError, OSError):
                proc.join(timeout=1)
                raise WorkerDied(f"a worker process ended without answering (exit code {proc.exitcode}; "
                                 "killed, or out of memory? try a smaller -j)") from None
            if status == "err":
                raise value
            yield value
            item = next(source, _END)
            if item is not _END:
                conn.send(item)
                busy.append(i)
    finally:
        for p, _ in workers:
            if p.is_alive():
                p.kill()
        for p, conn in workers:
            p.join()
            conn.close()
