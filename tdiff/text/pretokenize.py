"""jieba pre-tokenization: cut Chinese text into words before SentencePiece sees it.

Each text is cut into words by jieba (HMM=False, which loses nothing: the words
join back to the text), and a single space is glued to the word after it
("▁word" as SentencePiece likes it). For training, the words are joined by
DELIMITER, a private-use character that the trainer's
`pretokenization_delimiter` removes again, so no learned piece spans two words.
Loading jieba, its dictionary cache folder and the worker pool that segments
large training sets also live here.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Sequence

from tdiff.core.workers import ordered_map

DELIMITER = "\U000f0000"  # plane-15 private use: jieba word delimiter seen only by the trainer


def cache_dir() -> Path:
    """tdiff's cache folder: $XDG_CACHE_HOME/tdiff or ~/.cache/tdiff."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tdiff"


_jieba_ready = False


def init_jieba(quiet: bool | None = None) -> None:
    """Load jieba once per process; its dictionary cache goes to tdiff's cache folder.

    jieba's start-up lines reach stderr only with --verbose (QUIET None: tdiff's setting).
    """
    global _jieba_ready
    if _jieba_ready:
        return
    import logging

    import jieba

    if quiet is None:
        from tdiff.core import log

        quiet = not log.is_verbose()

    jieba.setLogLevel(logging.WARNING if quiet else logging.DEBUG)
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        if not os.access(d, os.W_OK):
            raise OSError
        jieba.dt.tmp_dir = str(d)
    except OSError:
        jieba.dt.tmp_dir = tempfile.gettempdir()
    jieba.initialize()
    _jieba_ready = True


def jieba_words(text: str) -> list[str]:
    """jieba words of TEXT (concatenating to TEXT exactly), a single space glued to the next word."""
    import jieba

    words = jieba.lcut(text, HMM=False)
    if "".join(words) != text:  # never seen; keep the guarantee anyway
        return [text] if text else []
    out: list[str] = []
    carry = ""
    for w in words:
        if w == " ":
            if carry:
                out.append(carry)
            carry = " "
        else:
            out.append(carry + w)
            carry = ""
    if carry:
        out.append(carry)
    return out


def _segment_for_training(text: str) -> str:
    return DELIMITER.join(jieba_words(text.replace(DELIMITER, "")))


def _pool_init_jieba() -> None:
    init_jieba(quiet=True)


def _segment_batch(texts: list[str]) -> list[str]:
    return [_segment_for_training(t) for t in texts]


def segment_for_training(texts: Sequence[str], jobs: int = 1) -> list[str]:
    """Delimiter-joined jieba words of each text (in order), using JOBS processes."""
    init_jieba()
    if jobs <= 1 or len(texts) < 2000:
        return [_segment_for_training(t) for t in texts]
    step = 500
    batches = [list(texts[i : i + step]) for i in range(0, len(texts), step)]
    out: list[str] = []
    with closing(ordered_map(_segment_batch, batches, jobs, initializer=_pool_init_jieba)) as parts:
        for part in parts:
            out.extend(part)
    return out
