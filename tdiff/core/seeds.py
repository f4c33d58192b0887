"""One derivation of every random seed from the user's `--seed`.

A command that needs several independent random streams (one per sampled batch,
one per data epoch, the training noise) derives each from the user's seed, a
stream name and an index with :func:`derive_seed`. One function for all of them
is what makes "same seed, same output" hold across `tdiff sample`, `tdiff eval
--speed`, the benchmarks and training, and keeps the streams apart.
"""

from __future__ import annotations

MULTIPLIER = 1_000_003           # a prime: (seed, index) pairs map to distinct values
STREAMS = {
    "sample": 0,                 # batch k of `tdiff sample` / `eval --speed` / AR generation
    "data": 1,                   # epoch k of the training data order
    "noise": 2,                  # the training noise (t, ε, spans) of a run
    "eval": 3,                   # held-out evaluation passes
}
# Streams sit 2^30 apart *in the low 32 bits*: torch's CPU generator (Mersenne Twister) keeps
# only the low 32 bits of a seed, so offsets of 2^32 or more would give every stream the same
# numbers. No run reaches 2^30 batches, epochs or steps, so the streams never overlap.
_STREAM_SHIFT = 30
_MASK = (1 << 63) - 1            # torch.Generator.manual_seed takes a non-negative int below 2^64


def derive_seed(seed: int, index: int = 0, stream: str = "sample") -> int:
    """The seed of item INDEX of random stream STREAM under the user's SEED.

    ``seed * 1_000_003 + index`` plus a fixed offset per stream (0 for "sample", k·2^30 for the
    k-th stream), reduced to 63 bits. Deterministic, platform-independent, cheap.
    """
    try:
        offset = STREAMS[stream] << _STREAM_SHIFT
    except KeyError:
        raise ValueError(f"unknown seed stream {stream!r}; known: {', '.join(STREAMS)}") from None
    return (int(seed) * MULTIPLIER + int(index) + offset) & _MASK


def generator(seed: int, index: int = 0, stream: str = "sample", device="cpu"):
    """A torch.Generator on DEVICE seeded with ``derive_seed(seed, index, stream)``."""
    import torch

    return torch.Generator(device=device).manual_seed(derive_seed(seed, index, stream))


MICRO_STREAMS = 8                # random streams per training micro-batch (the global one + named generators)


def micro_seed(seed: int, micro: int, slot: int = 0) -> int:
    """The seed of random stream SLOT (0: torch's global generator, 1…7: a trainer's named
    generators) for micro-batch MICRO of a training run: a function of (seed, micro, slot) only, so
    a micro-batch draws the same numbers whichever process computes it (data-parallel training,
    tdiff/training/distributed.py) and whatever ran before it (resume)."""
    if not 0 <= slot < MICRO_STREAMS:
        raise ValueError(f"micro-batch stream slot {slot} outside 0..{MICRO_STREAMS - 1}")
    return derive_seed(seed, int(micro) * MICRO_STREAMS + slot, "noise")
