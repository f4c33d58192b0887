"""One seed derivation for every random stream (tdiff/core/seeds.py)."""

from __future__ import annotations

import pytest

from tdiff.core.seeds import STREAMS, derive_seed


def test_sample_stream_keeps_its_values():
    """Batch k of `tdiff sample --seed S` has always been seeded with S·1,000,003 + k."""
    assert derive_seed(0, 0) == 0
    assert derive_seed(7, 3) == 7 * 1_000_003 + 3
    assert derive_seed(7, 3, "sample") == derive_seed(7, 3)


def test_streams_are_apart_and_seeds_valid():
    seen = {derive_seed(s, i, st) for s in range(5) for i in range(50) for st in STREAMS}
    assert len(seen) == 5 * 50 * len(STREAMS)                    # no two (seed, index, stream) collide
    assert all(0 <= v < 2**63 for v in seen)
    assert 0 <= derive_seed(-1, 0) < 2**63 and 0 <= derive_seed(2**70, 5, "data") < 2**63


def test_streams_draw_different_numbers():
    """torch's CPU generator keeps only the low 32 bits of a seed: the streams must differ there."""
    torch = pytest.importorskip("torch")
    from tdiff.core.seeds import generator

    firsts = {float(torch.rand(1, generator=generator(s, i, st))) for s in (0, 1, 12345) for i in range(20)
              for st in STREAMS}
    assert len(firsts) == 3 * 20 * len(STREAMS)
    assert {derive_seed(s, i, st) % 2**32 for s in (0, 1) for i in range(100) for st in STREAMS}.__len__() == 800


def test_unknown_stream():
    with pytest.raises(ValueError, match="noize"):
        derive_seed(0, 0, "noize")


def test_generator_is_seeded_by_derive_seed():
    torch = pytest.importorskip("torch")
    from tdiff.core.seeds import generator

    a = torch.rand(3, generator=generator(4, 2, "data"))
    b = torch.rand(3, generator=torch.Generator().manual_seed(derive_seed(4, 2, "data")))
    assert torch.equal(a, b)
