"""tdiff.evaluation.metrics against hand-computed values on tiny inputs (arithmetic in the comments)."""

from __future__ import annotations

import math
import random

import pytest

from tdiff.evaluation import metrics as M


# ---------------------------------------------------------------------------
# diversity


def test_unigram_entropy():
    # pooled counts a:2 b:2 -> p = 1/2, 1/2 -> H = ln 2
    assert M.unigram_entropy([["a", "a"], ["b", "b"]]) == pytest.approx(math.log(2))
    # four equiprobable symbols -> ln 4
    assert M.unigram_entropy([[1, 2, 3, 4]]) == pytest.approx(math.log(4))
    # a str is its characters: "aabb" -> ln 2
    assert M.unigram_entropy(["aab", "b"]) == pytest.approx(math.log(2))
    # counts 3:1 -> -(3/4 ln 3/4 + 1/4 ln 1/4)
    assert M.unigram_entropy([[0, 0, 0, 1]]) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert M.unigram_entropy([]) == 0.0
    assert M.unigram_entropy([["x"] * 5]) == 0.0


def test_distinct_n():
    samples = [["a", "b", "a", "b"], ["a", "b", "c"]]
    # bigrams: ab ba ab | ab bc -> 5 total, distinct {ab, ba, bc} = 3 -> 3/5
    assert M.distinct_n(samples, 2) == pytest.approx(3 / 5)
    # unigrams: 7 tokens, distinct {a, b, c} -> 3/7
    assert M.distinct_n(samples, 1) == pytest.approx(3 / 7)
    # trigrams: aba bab | abc -> 3 total, all distinct -> 1
    assert M.distinct_n(samples, 3) == 1.0
    # n-grams do not cross samples: ["a"],["b"] has no bigram
    assert M.distinct_n([["a"], ["b"]], 2) == 0.0
    assert M.distinct_n([], 1) == 0.0
    with pytest.raises(ValueError):
        M.distinct_n(samples, 0)


def test_repetition_rate():
    # "a b a b a": bigrams ab ba ab ba; the 3rd and 4th repeat earlier ones -> 2/4
    assert M.repetition_rate(["a b a b a".split()], 2) == pytest.approx(0.5)
    # pooled with "x y z" (bigrams xy yz, no repeats): 2 / (4 + 2)
    assert M.repetition_rate(["a b a b a".split(), "x y z".split()], 2) == pytest.approx(1 / 3)
    # unigrams of "a b a b a": a b a b a -> repeats at positions 3,4,5 -> 3/5
    assert M.repetition_rate(["a b a b a".split()], 1) == pytest.approx(3 / 5)
    # repeats across samples do not count
    assert M.repetition_rate([["a", "b"], ["a", "b"]], 2) == 0.0
    assert M.repetition_rate([["a"]], 2) == 0.0


# ---------------------------------------------------------------------------
# BLEU / ROUGE


def _naive_self_bleu(texts, tokenize):
    from sacrebleu.metrics import BLEU

    b = BLEU(effective_order=True, tokenize=tokenize)
    return sum(b.sentence_score(t, texts[:i] + texts[i + 1 :]).score for i, t in enumerate(texts)) / len(texts)


def test_self_bleu_extremes():
    same = ["床前明月光，疑是地上霜。"] * 4
    assert M.self_bleu(same) == pytest.approx(100.0)
    # no character in common between any two texts -> no matched n-gram -> BLEU 0 each
    assert M.self_bleu(["甲乙丙丁", "戊己庚辛", "子丑寅卯"]) == 0.0
    assert M.self_bleu(["only one"]) == 0.0


def test_self_bleu_equals_sacrebleu_sentence_scores():
    # Random texts over a small alphabet: many shared and repeated n-grams, equal-length ties.
    rng = random.Random(0)
    zh = ["".join(rng.choice("春花秋月何时了，") for _ in range(rng.choice([6, 8, 10, 12]))) for _ in range(12)]
    assert M.self_bleu(zh, tokenize="zh") == pytest.approx(_naive_self_bleu(zh, "zh"), abs=1e-9)
    assert M.self_bleu(zh, tokenize="char") == pytest.approx(_naive_self_bleu(zh, "char"), abs=1e-9)
    en = [" ".join(rng.choice(["the", "cat", "sat", "on", "mat", "a"]) for _ in range(rng.randint(3, 9))) for _ in range(10)]
    assert M.self_bleu(en, tokenize="13a") == pytest.approx(_naive_self_bleu(en, "13a"), abs=1e-9)
    # max_samples keeps the first texts only
    assert M.self_bleu(zh, max_samples=5) == pytest.approx(_naive_self_bleu(zh[:5], "zh"), abs=1e-9)
    with pytest.raises(ValueError, match="tokenizer"):
        M.self_bleu(zh, tokenize="nope")


def test_bleu():
    assert M.bleu(["a b c d"], ["a b c d"], tokenize="none") == pytest.approx(100.0)
    # all n-gram precisions 1; hyp 4 tokens, ref 5 -> BP = exp(1 - 5/4) -> 100·e^-0.25
    assert M.bleu(["a b c d"], ["a b c d e"], tokenize="none") == pytest.approx(100 * math.exp(-0.25))
    # several references per hypothesis: the matching one gives 100
    assert M.bleu(["a b c d"], [["x y z w", "a b c d"]], tokenize="none") == pytest.approx(100.0)
    # Chinese, character level
    assert M.bleu(["床前明月光"], ["床前明月光"]) == pytest.approx(100.0)
    with pytest.raises(ValueError):
        M.bleu(["a"], ["a", "b"])


def _dp_lcs(a, b):
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def test_lcs_length_matches_dynamic_program():
    assert M.lcs_length("ABCBDAB", "BDCABA") == 4  # CLRS example: BCBA
    assert M.lcs_length("", "abc") == 0
    rng = random.Random(1)
    for _ in range(200):
        a = "".join(rng.choice("abc") for _ in range(rng.randint(0, 70)))
        b = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 70)))
        assert M.lcs_length(a, b) == _dp_lcs(a, b)


def test_rouge_l():
    # LCS(ABCBDAB, BDCABA) = 4; P = 4/7, R = 4/6; F = 2PR/(P+R) = (32/42)/(52/42) = 8/13
    assert M.rouge_l(["ABCBDAB"], ["BDCABA"]) == pytest.approx(8 / 13)
    # 床前明月光 vs 床前看月光: LCS 床前月光 = 4, P = R = 4/5 -> F = 0.8
    assert M.rouge_l(["床前明月光"], ["床前看月光"]) == pytest.approx(0.8)
    # whitespace is ignored at character level
    assert M.rouge_l(["床前 明月光"], ["床前明月光"]) == pytest.approx(1.0)
    # words: LCS 3, P = 3/3, R = 3/6 -> F = 2·1·0.5/1.5 = 2/3; mean with a disjoint pair (0) -> 1/3
    hyps, refs = ["the cat sat", "x"], ["the cat sat on the mat", "y"]
    assert M.rouge_l(hyps, refs, char_level=False) == pytest.approx(1 / 3)
    # token lists are used as they are
    assert M.rouge_l([[1, 2, 3]], [[1, 3]]) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert M.rouge_l([""], ["abc"]) == 0.0


# ---------------------------------------------------------------------------
# lengths and latency


def test_length_stats_and_ratio():
    s = M.length_stats([10, 1, 3, 2, 4])
    # sorted 1 2 3 4 10: mean 20/5 = 4; p50 = 3; p95: h = 4·0.95 = 3.8 -> 4 + 0.8·(10-4) = 8.8
    assert s == pytest.approx({"mean": 4.0, "p50": 3.0, "p95": 8.8, "min": 1.0, "max": 10.0})
    assert M.length_ratio([9, 11], [10, 10]) == pytest.approx(1.0)
    assert M.length_ratio([11, 11], [10]) == pytest.approx(1.1)
    with pytest.raises(ValueError):
        M.length_stats([])


def test_latency_percentiles():
    # 1 2 3 4: p50 = 2.5; p95: h = 3·0.95 = 2.85 -> 3 + 0.85 = 3.85; mean 2.5
    assert M.latency_percentiles([4, 1, 3, 2]) == pytest.approx({"p50": 2.5, "p95": 3.85, "mean": 2.5})


# ---------------------------------------------------------------------------
# control text


def test_shuffle_chars():
    texts = ["床前明月光", "疑是地上霜", "举头望明月"]
    out = M.shuffle_chars(texts, seed=0)
    assert [len(t) for t in out] == [5, 5, 5]
    assert sorted("".join(out)) == sorted("".join(texts))
    assert out == M.shuffle_chars(texts, seed=0)
    assert out != texts
    assert out != M.shuffle_chars(texts, seed=1)
    assert M.shuffle_chars([], seed=0) == []


# ---------------------------------------------------------------------------
# memorization


def test_ngram_overlap():
    train = [[1, 2, 3, 4, 5]]
    # train bigrams {12, 23, 34, 45}; sample bigrams 12 23 39 | 45 -> 3 of 4 seen
    samples = [[1, 2, 3, 9], [4, 5]]
    assert M.ngram_overlap(samples, train, n=2) == pytest.approx(3 / 4)
    index = M.NgramSet(train, n=2)
    assert len(index) == 4 and (3, 4) in index and (5, 1) not in index
    assert M.ngram_overlap(samples, index, n=2) == pytest.approx(3 / 4)
    with pytest.raises(ValueError):
        M.ngram_overlap(samples, index, n=3)
    # multiplicity counts: 12 12 -> both seen; 21 not -> 2/3
    assert M.ngram_overlap([[1, 2, 1, 2]], train, n=2) == pytest.approx(2 / 3)
    # characters as tokens; no n-grams across training texts: "光疑" does not occur
    assert M.ngram_overlap(["明月光疑"], ["床前明月光", "疑是地上霜"], n=2) == pytest.approx(2 / 3)
    assert M.ngram_overlap([[1]], train, n=2) == 0.0
    assert M.ngram_overlap([[1, 2]], [], n=2) == 0.0


# ---------------------------------------------------------------------------
# perplexity


def test_perplexity_from_logits_uniform():
    torch = pytest.importorskip("torch")
    # uniform logits over V = 4: every target has probability 1/4 -> NLL ln 4 per token -> PPL 4
    logits = torch.zeros(2, 3, 4)
    targets = torch.tensor([[0, 1, 2], [3, -100, -100]])
    nll, count = M.perplexity_from_logits(logits, targets)
    assert count == 4
    assert nll == pytest.approx(4 * math.log(4), rel=1e-6)
    assert M.ppl(nll, count) == pytest.approx(4.0, rel=1e-6)
    # bf16 logits are scored in float32
    nll16, _ = M.perplexity_from_logits(logits.bfloat16(), targets)
    assert nll16 == pytest.approx(nll, rel=1e-6)


def test_perplexity_from_logits_known_probability():
    torch = pytest.importorskip("torch")
    # logits (ln 3, 0): p(0) = 3/4, p(1) = 1/4; targets 0, 1 -> NLL = ln(4/3) + ln 4
    logits = torch.tensor([[math.log(3), 0.0], [math.log(3), 0.0]])
    nll, count = M.perplexity_from_logits(logits, torch.tensor([0, 1]), ignore_index=-1)
    assert count == 2 and nll == pytest.approx(math.log(4 / 3) + math.log(4), rel=1e-6)
    # PPL = exp(NLL/2) = sqrt(4/3 · 4) = 4/sqrt(3)
    assert M.ppl(nll, count) == pytest.approx(4 / math.sqrt(3), rel=1e-6)
    with pytest.raises(ValueError):
        M.ppl(1.0, 0)


def test_q_position():
    assert M.q_position(20.0, 20.0, 400.0) == pytest.approx(0.0)
    assert M.q_position(400.0, 20.0, 400.0) == pytest.approx(1.0)
    # geometric midpoint: ln(100/10) / ln(1000/10) = 1/2
    assert M.q_position(100.0, 10.0, 1000.0) == pytest.approx(0.5)
    # not clipped
    assert M.q_position(5.0, 10.0, 1000.0) == pytest.approx(math.log(0.5) / math.log(100))
    with pytest.raises(ValueError):
        M.q_position(10.0, 10.0, 10.0)
    with pytest.raises(ValueError):
        M.q_position(0.0, 10.0, 100.0)
