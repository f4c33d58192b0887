"""tdiff.workers.ordered_map: order, errors, and stopping that never hangs (issue 10)."""

import os
import signal
import time
from contextlib import closing

import pytest

from tdiff.core.errors import DataError
from tdiff.core.workers import WorkerDied, ordered_map

_scale = {"k": 1}


def _init(k):
    _scale["k"] = k


def _times(x):
    if x == "bad":
        raise DataError("f.jsonl:7: bad record")
    if x == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if x == "pid":
        return os.getpid()
    time.sleep(0.001 * (x % 3))  # uneven work: answers would come back out of order
    return x * _scale["k"]


def _init_fails():
    raise ValueError("no model")


def test_results_in_input_order_with_initializer():
    out = list(ordered_map(_times, range(50), 3, initializer=_init, initargs=(10,)))
    assert out == [10 * x for x in range(50)]


def test_reads_items_lazily():
    seen = []

    def items():
        for x in range(100):
            seen.append(x)
            yield x

    with closing(ordered_map(_times, items(), 2)) as gen:
        assert next(gen) == 0
        assert len(seen) <= 3  # two in flight, plus the one sent after the first answer


def test_worker_exception_is_reraised_in_the_parent():
    with pytest.raises(DataError, match="f.jsonl:7"):
        list(ordered_map(_times, [1, 2, "bad", 4], 2))


def test_initializer_failure_is_reported():
    with pytest.raises(ValueError, match="no model"):
        list(ordered_map(_times, [1, 2], 2, initializer=_init_fails))


def test_dead_worker_is_an_error_not_a_hang():
    t0 = time.monotonic()
    with pytest.raises(WorkerDied, match="ended without answering"):
        list(ordered_map(_times, [1, "die", 3, 4], 2))
    assert time.monotonic() - t0 < 30


def test_closing_kills_every_worker():
    gen = ordered_map(_times, ["pid", "pid"] + list(range(10)), 2)
    pids = [next(gen), next(gen)]
    gen.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # killed and reaped
            os.kill(pid, 0)


def test_jieba_segmentation_in_two_processes_equals_one():
    from tdiff.text.pretokenize import segment_for_training

    texts = [f"第{i}首：明月几时有，把酒问青天。不知天上宫阙，今夕是何年。" for i in range(2400)]
    assert segment_for_training(texts, jobs=2) == segment_for_training(texts, jobs=1)
