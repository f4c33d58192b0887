"""bench/quality/text_stats.py (statistics only the benchmarks use) against hand-computed values and brute force."""

from __future__ import annotations

import math
import random

import pytest

from bench.quality.text_stats import (SubstringIndex, _suffix_array, char_unigram_kl, longest_common_substring,
                                      max_lcs_stats)
from conftest import head_lines, shared_file
from tdiff.evaluation.metrics import shuffle_chars


# ---------------------------------------------------------------------------
# character distributions


def test_char_unigram_kl():
    assert char_unigram_kl(["床前明月光"], ["光月明前床"]) == pytest.approx(0.0, abs=1e-12)
    # ref "ab": P = (1/2, 1/2); samples "aaab": Q = (3/4, 1/4)
    # KL(P||Q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3)
    assert char_unigram_kl(["aaab"], ["ab"], smoothing=0) == pytest.approx(0.5 * math.log(4 / 3))
    # ref "aa", samples "bb", one pseudo-count each: P = (3/4, 1/4), Q = (1/4, 3/4)
    # KL = 3/4 ln 3 + 1/4 ln(1/3) = 1/2 ln 3
    assert char_unigram_kl(["bb"], ["aa"], smoothing=1) == pytest.approx(0.5 * math.log(3))
    # a reference character the samples never produce, no smoothing: infinite
    assert char_unigram_kl(["aa"], ["ab"], smoothing=0) == math.inf
    # default smoothing keeps it finite but large
    assert 5 < char_unigram_kl(["aa"], ["ab"]) < 20


# ---------------------------------------------------------------------------
# memorization: longest substring shared with the training data


def _brute_lcsubstr(sample, docs):
    best = 0
    for i in range(len(sample)):
        for j in range(i + best + 1, len(sample) + 1):
            if any(sample[i:j] in d for d in docs):
                best = j - i
            else:
                break
    return best


def test_suffix_array_matches_sorting():
    np = pytest.importorskip("numpy")
    rng = random.Random(3)
    for _ in range(30):
        s = "".join(rng.choice("ab") for _ in range(rng.randint(1, 60)))
        codes = np.frombuffer(s.encode("utf-32-le"), dtype=np.uint32)
        assert _suffix_array(codes).tolist() == sorted(range(len(s)), key=lambda i: s[i:])


def test_substring_index_small():
    idx = SubstringIndex(["abcde", "xyz"])
    # "cde" ends document 0; "cdexy" would match only across the separator -> 3
    assert longest_common_substring("cdexy", idx) == 3
    assert idx.find_longest("cdexy") == (3, 0, 0)
    assert idx.find_longest("qqxyz") == (3, 1, 2)
    assert idx.find_longest("qqq") == (0, -1, -1)
    assert longest_common_substring("", idx) == 0
    # Chinese: 明月光 in poem 0, 疑是 in poem 1; never 明月光疑是 (5)
    zh = SubstringIndex(["床前明月光", "疑是地上霜"])
    assert longest_common_substring("明月光疑是", zh) == 3
    assert longest_common_substring("地上霜", zh) == 3
    # a separator character inside the sample does not bridge two documents
    two = SubstringIndex(["ab", "cd"])
    assert longest_common_substring("b" + two.sep + "c", two) == 1
    assert longest_common_substring("abc", SubstringIndex([])) == 0


def test_substring_index_matches_brute_force():
    rng = random.Random(4)
    for _ in range(20):
        docs = ["".join(rng.choice("春花秋月") for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(1, 5))]
        idx = SubstringIndex(docs)
        for _ in range(5):
            s = "".join(rng.choice("春花秋月夜") for _ in range(rng.randint(0, 25)))
            assert idx.longest(s) == _brute_lcsubstr(s, docs), (docs, s)


def test_max_lcs_stats():
    idx = SubstringIndex(["abcde", "xyz"])
    # "abc" -> 3, "aq" -> 1, "qq" -> 0: mean 4/3, max 3, median 1
    assert max_lcs_stats(["abc", "aq", "qq"], idx) == pytest.approx({"mean": 4 / 3, "max": 3.0, "p50": 1.0})


def test_substring_index_on_real_poems():
    poems = head_lines(shared_file("songci.txt"), 1000)
    idx = SubstringIndex(poems)
    assert len(idx) == sum(map(len, poems)) + len(poems) - 1
    # a verbatim fragment is found whole, in its poem
    frag = poems[123][5:45]
    length, doc, _ = idx.find_longest("ＱＱ" + frag + "ＱＱ")
    assert length == len(frag) and frag in poems[doc]
    # shuffled characters rarely copy more than a few characters
    shuffled = shuffle_chars(poems[:20], seed=0)
    assert max_lcs_stats(shuffled, idx)["p50"] <= 4
