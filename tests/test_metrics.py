"""tdiff.metrics against hand-computed values on tiny inputs (arithmetic in the comments)."""

from __future__ import annotations

import math
import random

import pytest

from conftest import head_lines, shared_file
from tdiff import metrics as M


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


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    xs = [random.Random(2).random() for _ in range(37)]
    for q in (0, 5, 50, 95, 100):
        assert M.percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_latency_percentiles():
    # 1 2 3 4: p50 = 2.5; p95: h = 3·0.95 = 2.85 -> 3 + 0.85 = 3.85; mean 2.5
    assert M.latency_percentiles([4, 1, 3, 2]) == pytest.approx({"p50": 2.5, "p95": 3.85, "mean": 2.5})


# ---------------------------------------------------------------------------
# character distributions


def test_char_unigram_kl():
    assert M.char_unigram_kl(["床前明月光"], ["光月明前床"]) == pytest.approx(0.0, abs=1e-12)
    # ref "ab": P = (1/2, 1/2); samples "aaab": Q = (3/4, 1/4)
    # KL(P||Q) = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3)
    assert M.char_unigram_kl(["aaab"], ["ab"], smoothing=0) == pytest.approx(0.5 * math.log(4 / 3))
    # ref "aa", samples "bb", one pseudo-count each: P = (3/4, 1/4), Q = (1/4, 3/4)
    # KL = 3/4 ln 3 + 1/4 ln(1/3) = 1/2 ln 3
    assert M.char_unigram_kl(["bb"], ["aa"], smoothing=1) == pytest.approx(0.5 * math.log(3))
    # a reference character the samples never produce, no smoothing: infinite
    assert M.char_unigram_kl(["aa"], ["ab"], smoothing=0) == math.inf
    # default smoothing keeps it finite but large
    assert 5 < M.char_unigram_kl(["aa"], ["ab"]) < 20


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
        assert M._suffix_array(codes).tolist() == sorted(range(len(s)), key=lambda i: s[i:])


def test_substring_index_small():
    idx = M.SubstringIndex(["abcde", "xyz"])
    # "cde" ends document 0; "cdexy" would match only across the separator -> 3
    assert M.longest_common_substring("cdexy", idx) == 3
    assert idx.find_longest("cdexy") == (3, 0, 0)
    assert idx.find_longest("qqxyz") == (3, 1, 2)
    assert idx.find_longest("qqq") == (0, -1, -1)
    assert M.longest_common_substring("", idx) == 0
    # Chinese: 明月光 in poem 0, 疑是 in poem 1; never 明月光疑是 (5)
    zh = M.SubstringIndex(["床前明月光", "疑是地上霜"])
    assert M.longest_common_substring("明月光疑是", zh) == 3
    assert M.longest_common_substring("地上霜", zh) == 3
    # a separator character inside the sample does not bridge two documents
    two = M.SubstringIndex(["ab", "cd"])
    assert M.longest_common_substring("b" + two.sep + "c", two) == 1
    assert M.longest_common_substring("abc", M.SubstringIndex([])) == 0


def test_substring_index_matches_brute_force():
    rng = random.Random(4)
    for _ in range(20):
        docs = ["".join(rng.choice("春花秋月") for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(1, 5))]
        idx = M.SubstringIndex(docs)
        for _ in range(5):
            s = "".join(rng.choice("春花秋月夜") for _ in range(rng.randint(0, 25)))
            assert idx.longest(s) == _brute_lcsubstr(s, docs), (docs, s)


def test_max_lcs_stats():
    idx = M.SubstringIndex(["abcde", "xyz"])
    # "abc" -> 3, "aq" -> 1, "qq" -> 0: mean 4/3, max 3, median 1
    assert M.max_lcs_stats(["abc", "aq", "qq"], idx) == pytest.approx({"mean": 4 / 3, "max": 3.0, "p50": 1.0})


def test_substring_index_on_real_poems():
    poems = head_lines(shared_file("songci.txt"), 1000)
    idx = M.SubstringIndex(poems)
    assert len(idx) == sum(map(len, poems)) + len(poems) - 1
    # a verbatim fragment is found whole, in its poem
    frag = poems[123][5:45]
    length, doc, _ = idx.find_longest("ＱＱ" + frag + "ＱＱ")
    assert length == len(frag) and frag in poems[doc]
    # shuffled characters rarely copy more than a few characters
    shuffled = M.shuffle_chars(poems[:20], seed=0)
    assert M.max_lcs_stats(shuffled, idx)["p50"] <= 4


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
