"""Metrics for generated text that `tdiff eval` reports: diversity, overlap with references,
n-gram memorization, perplexity, lengths and latency.

Every function is deterministic and pure: lists in, numbers out. Inputs are either
"token lists" (a list of sequences of hashable tokens: token ids, words, or a ``str``,
which counts as its sequence of characters) or plain strings, as each docstring says.
Heavy imports (torch, numpy, sacrebleu) happen inside the functions that need them,
so importing this module is free.

Conventions
- Entropies and NLLs are in nats.
- Ratios (distinct-n, repetition, overlap, ROUGE-L) are in [0, 1]; BLEU and self-BLEU are
  on sacrebleu's 0-100 scale.
- Percentiles interpolate linearly between order statistics (numpy's default, Hyndman-Fan type 7).
- Summary statistics of nothing (empty ``lengths`` or ``times``) raise ValueError;
  ratios with an empty denominator return 0.0 where the docstring says so.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Hashable, Iterable, Sequence

__all__ = [
    "unigram_entropy",
    "distinct_n",
    "repetition_rate",
    "self_bleu",
    "bleu",
    "rouge_l",
    "lcs_length",
    "length_stats",
    "length_ratio",
    "shuffle_chars",
    "NgramSet",
    "ngram_overlap",
    "perplexity_from_logits",
    "ppl",
    "q_position",
    "latency_percentiles",
]

TokenLists = Iterable[Sequence[Hashable]]


# ---------------------------------------------------------------------------
# small helpers


def _ngrams(tokens: Sequence[Hashable], n: int):
    """The n-grams of one sequence as tuples, in order (none when len < n)."""
    return (tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"n-gram order must be >= 1, got {n}")


def _percentiles(xs: Sequence[float], *qs: float) -> list[float]:
    """The QS-th percentiles (0-100) of XS: ``numpy.percentile``, linear interpolation between order statistics."""
    import numpy as np

    return [float(v) for v in np.percentile(xs, qs)]


# ---------------------------------------------------------------------------
# diversity


def unigram_entropy(token_lists: TokenLists) -> float:
    """Shannon entropy (nats) of the unigram distribution pooled over all samples.

    H = -Σ_w p(w) ln p(w), p(w) = count(w) / total count. 0.0 for no tokens.
    """
    counts: Counter = Counter()
    for toks in token_lists:
        counts.update(toks)
    total = sum(counts.values())
    if total == 0:
        return 0.0
    return -sum(c / total * math.log(c / total) for c in counts.values())


def distinct_n(token_lists: TokenLists, n: int) -> float:
    """Distinct-n (Li et al. 2016, "A Diversity-Promoting Objective Function for Neural
    Conversation Models"): number of distinct n-grams / total number of n-grams, both pooled
    over all samples (corpus level). N-grams never cross sample boundaries. 0.0 for no n-grams.
    """
    _check_n(n)
    seen = set()
    total = 0
    for toks in token_lists:
        for g in _ngrams(toks, n):
            seen.add(g)
            total += 1
    return len(seen) / total if total else 0.0


def repetition_rate(token_lists: TokenLists, n: int = 2) -> float:
    """Share of n-grams that repeat an earlier n-gram of the same sample, pooled over samples.

    rate = Σ_samples #{positions i : ngram_i ∈ {ngram_j : j < i}} / Σ_samples #ngrams.
    A sample that loops ("a b a b a") scores high; repeats across samples do not count
    (that is what self-BLEU and distinct-n measure). 0.0 for no n-grams.
    """
    _check_n(n)
    repeats = 0
    total = 0
    for toks in token_lists:
        seen = set()
        for g in _ngrams(toks, n):
            total += 1
            if g in seen:
                repeats += 1
            else:
                seen.add(g)
    return repeats / total if total else 0.0


# ---------------------------------------------------------------------------
# BLEU / ROUGE (references)


def _bleu_metric(tokenize: str, max_n: int, effective_order: bool):
    from sacrebleu.metrics import BLEU

    if tokenize not in BLEU.TOKENIZERS:
        raise ValueError(
            f"unknown BLEU tokenizer {tokenize!r}; choose one of {', '.join(sorted(BLEU.TOKENIZERS))} "
            "('zh' or 'char' for Chinese)"
        )
    return BLEU(tokenize=tokenize, max_ngram_order=max_n, effective_order=effective_order)


def self_bleu(
    texts: Sequence[str],
    tokenize: str = "zh",
    max_n: int = 4,
    max_samples: int | None = 200,
) -> float:
    """Self-BLEU (Zhu et al. 2018, Texygen): mean over samples of the sentence BLEU of each
    sample against all the other samples as references. Higher = less diverse; 100 when all
    samples are identical, ≈ 0 when they share no n-grams. sacrebleu 0-100 scale.

    Exactly sacrebleu's ``BLEU(tokenize=..., effective_order=True, max_ngram_order=max_n)
    .sentence_score(texts[i], texts[:i] + texts[i+1:])`` (exp smoothing, closest reference
    length), averaged over i; computed in O(N·L) instead of O(N²·L) by keeping, for each n-gram,
    its two largest per-sample counts (the leave-one-out maximum is one of them).

    ``tokenize``: a sacrebleu tokenizer name. "zh" (default) splits every CJK character and
    punctuation mark into its own token and tokenizes the rest like "13a", so it is
    character-level for Chinese and word-level for English; "char" splits every character;
    "13a" is sacrebleu's default for European languages; "none" splits on whitespace only.
    Only the first ``max_samples`` texts are used (None = all). Fewer than 2 texts: 0.0.
    """
    # sacrebleu internals (extract_all_word_ngrams, metric.tokenizer, metric.compute_bleu): pyproject.toml
    # pins sacrebleu to 2.x, and tests/evaluation/test_metrics.py checks the result against the public sentence_score.
    from sacrebleu.metrics.helpers import extract_all_word_ngrams

    texts = list(texts)[:max_samples] if max_samples is not None else list(texts)
    if len(texts) < 2:
        return 0.0
    metric = _bleu_metric(tokenize, max_n, effective_order=True)
    # Same preprocessing as sacrebleu: strip trailing whitespace, then tokenize.
    stats = [extract_all_word_ngrams(metric.tokenizer(t.rstrip()), 1, max_n) for t in texts]
    # For each n-gram: (largest count, sample holding it, second largest count).
    top: dict[tuple, list] = {}
    for i, (counts, _) in enumerate(stats):
        for g, c in counts.items():
            t = top.get(g)
            if t is None:
                top[g] = [c, i, 0]
            elif c > t[0]:
                t[2] = t[0]
                t[0], t[1] = c, i
            elif c > t[2]:
                t[2] = c
    lens = [length for _, length in stats]
    scores = []
    for i, (counts, hyp_len) in enumerate(stats):
        correct = [0] * max_n
        total = [0] * max_n
        for g, c in counts.items():
            t = top[g]
            ref_count = t[2] if t[1] == i else t[0]
            total[len(g) - 1] += c
            correct[len(g) - 1] += min(c, ref_count)
        # sacrebleu's closest reference length: smallest |hyp - ref|, ties to the shorter one.
        ref_len = min((r for j, r in enumerate(lens) if j != i), key=lambda r: (abs(hyp_len - r), r))
        score = metric.compute_bleu(
            correct, total, hyp_len, ref_len,
            smooth_method=metric.smooth_method, smooth_value=metric.smooth_value,
            effective_order=True, max_ngram_order=max_n,
        )
        scores.append(score.score)
    return sum(scores) / len(scores)


def bleu(
    hyps: Sequence[str],
    refs: Sequence[str] | Sequence[Sequence[str]],
    tokenize: str = "zh",
    max_n: int = 4,
) -> float:
    """Corpus BLEU (Papineni et al. 2002) with sacrebleu, 0-100 scale.

    ``refs`` is one reference string per hypothesis, or one list of references per hypothesis
    (every list the same length). ``tokenize`` as in :func:`self_bleu`.
    """
    hyps = list(hyps)
    refs = list(refs)
    if len(refs) != len(hyps):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        return 0.0
    if all(isinstance(r, str) for r in refs):
        streams = [refs]
    else:
        k = len(refs[0])
        if any(isinstance(r, str) or len(r) != k for r in refs):
            raise ValueError("every hypothesis needs the same number of references")
        streams = [[r[j] for r in refs] for j in range(k)]
    metric = _bleu_metric(tokenize, max_n, effective_order=False)
    return float(metric.corpus_score(hyps, streams).score)


def lcs_length(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Length of the longest common subsequence of two sequences.

    Bit-parallel form of the O(|a|·|b|) dynamic program (Allison & Dix 1986; Hyyrö 2004,
    "Bit-parallel LCS-length computation revisited"): bit i of V is 0 where the DP row steps
    up at position i of ``a``; for each symbol of ``b``, U = V & match(sym), V = (V + U) | (V - U).
    The LCS length is the number of zero bits of V. Equal to the textbook DP (tested).
    """
    if not a or not b:
        return 0
    match: dict = {}
    for i, sym in enumerate(a):
        match[sym] = match.get(sym, 0) | (1 << i)
    mask = (1 << len(a)) - 1
    v = mask
    for sym in b:
        u = v & match.get(sym, 0)
        v = ((v + u) | (v - u)) & mask
    return len(a) - bin(v).count("1")


def _rouge_units(x, char_level: bool):
    if not isinstance(x, str):
        return list(x)
    if char_level:
        return [c for c in x if not c.isspace()]
    return x.split()


def rouge_l(
    hyps: Sequence[str | Sequence[Hashable]],
    refs: Sequence[str | Sequence[Hashable]],
    char_level: bool = True,
) -> float:
    """ROUGE-L F-measure (Lin 2004, "ROUGE: A Package for Automatic Evaluation of Summaries"),
    β = 1, averaged over hypothesis/reference pairs; in [0, 1].

    Per pair: P = LCS/|hyp|, R = LCS/|ref|, F = 2PR/(P+R) (0 when LCS = 0).
    Strings are split into characters without whitespace (``char_level=True``, for Chinese)
    or into whitespace-separated words; token lists are used as they are.
    """
    hyps, refs = list(hyps), list(refs)
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        return 0.0
    total = 0.0
    for h, r in zip(hyps, refs):
        hu, ru = _rouge_units(h, char_level), _rouge_units(r, char_level)
        lcs = lcs_length(hu, ru)
        if lcs:
            p, rec = lcs / len(hu), lcs / len(ru)
            total += 2 * p * rec / (p + rec)
    return total / len(hyps)


# ---------------------------------------------------------------------------
# lengths and latency


def length_stats(lengths: Iterable[float]) -> dict:
    """{"mean", "p50", "p95", "min", "max"} of a list of lengths (tokens or characters)."""
    xs = [float(x) for x in lengths]
    if not xs:
        raise ValueError("length_stats of an empty list")
    p50, p95 = _percentiles(xs, 50, 95)
    return {
        "mean": sum(xs) / len(xs),
        "p50": p50,
        "p95": p95,
        "min": min(xs),
        "max": max(xs),
    }


def length_ratio(sample_lengths: Iterable[float], ref_lengths: Iterable[float]) -> float:
    """mean(sample lengths) / mean(reference lengths); 1.0 = right length on average."""
    s = [float(x) for x in sample_lengths]
    r = [float(x) for x in ref_lengths]
    if not s or not r:
        raise ValueError("length_ratio needs at least one sample and one reference length")
    ref_mean = sum(r) / len(r)
    if ref_mean == 0:
        raise ValueError("reference lengths average to 0")
    return (sum(s) / len(s)) / ref_mean


def latency_percentiles(times: Iterable[float]) -> dict:
    """{"p50", "p95", "mean"} of a list of latencies (any unit; the caller's)."""
    xs = [float(x) for x in times]
    if not xs:
        raise ValueError("latency_percentiles of an empty list")
    p50, p95 = _percentiles(xs, 50, 95)
    return {"p50": p50, "p95": p95, "mean": sum(xs) / len(xs)}


# ---------------------------------------------------------------------------
# control text


def shuffle_chars(texts: Sequence[str], seed: int = 0) -> list[str]:
    """The "shuffled-character" control text: pool the characters of all ``texts``,
    shuffle them with ``random.Random(seed)``, and cut the pool back into pieces of the
    original lengths. Same unigram distribution and lengths, no word or phrase structure.
    """
    texts = list(texts)
    pool = list("".join(texts))
    random.Random(seed).shuffle(pool)
    out, start = [], 0
    for t in texts:
        out.append("".join(pool[start : start + len(t)]))
        start += len(t)
    return out


# ---------------------------------------------------------------------------
# memorization: n-gram overlap


class NgramSet:
    """A compact set of the n-grams of a training corpus, for :func:`ngram_overlap`.

    Stores one 8-byte Python ``hash`` per distinct n-gram in a sorted numpy array (16 MB for
    2M n-grams, where a Python ``set`` of tuples would take ~10× that). Hash collisions
    (probability ~ count²/2⁶⁴) are ignored. Hashes of ``str`` tokens are salted per process
    (PYTHONHASHSEED), so an NgramSet is only meaningful within the process that built it;
    results do not depend on the salt.
    """

    def __init__(self, token_lists: TokenLists, n: int = 4):
        import numpy as np

        _check_n(n)
        self.n = n
        hashes = np.fromiter(
            (hash(g) for toks in token_lists for g in _ngrams(toks, n)), dtype=np.int64
        )
        self._hashes = np.unique(hashes)

    def __len__(self) -> int:
        return len(self._hashes)

    def contains(self, ngrams: Sequence[tuple]):
        """Boolean numpy array: is each n-gram in the set?"""
        import numpy as np

        q = np.fromiter((hash(g) for g in ngrams), dtype=np.int64, count=len(ngrams))
        if len(self._hashes) == 0:
            return np.zeros(len(q), dtype=bool)
        pos = np.minimum(np.searchsorted(self._hashes, q), len(self._hashes) - 1)
        return self._hashes[pos] == q

    def __contains__(self, ngram: tuple) -> bool:
        return bool(self.contains([tuple(ngram)])[0])


def ngram_overlap(
    sample_token_lists: TokenLists,
    train_token_lists: TokenLists | NgramSet,
    n: int = 4,
) -> float:
    """Memorization: share of the samples' n-grams (counted with multiplicity) that occur
    anywhere in the training data. ``train_token_lists`` may be a prebuilt :class:`NgramSet`
    (build it once, score many sample sets). 0.0 when the samples have no n-grams.
    """
    index = train_token_lists if isinstance(train_token_lists, NgramSet) else NgramSet(train_token_lists, n)
    if index.n != n:
        raise ValueError(f"NgramSet holds {index.n}-grams but n={n}")
    grams = [g for toks in sample_token_lists for g in _ngrams(toks, n)]
    if not grams:
        return 0.0
    return float(index.contains(grams).sum()) / len(grams)


# ---------------------------------------------------------------------------
# perplexity


def perplexity_from_logits(logits, targets, ignore_index: int = -100) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) and number of scored tokens.

    ``logits``: (..., V) unnormalized scores; ``targets``: (...) token ids aligned with them
    (shift them yourself for a causal LM); positions equal to ``ignore_index`` do not count.
    Computed in float32 whatever the logits dtype. Sum over batches, then :func:`ppl`.
    """
    import torch.nn.functional as F

    v = logits.shape[-1]
    flat_t = targets.reshape(-1)
    nll = F.cross_entropy(
        logits.reshape(-1, v).float(), flat_t, ignore_index=ignore_index, reduction="sum"
    )
    return float(nll), int((flat_t != ignore_index).sum())


def ppl(nll_sum: float, count: int) -> float:
    """Perplexity exp(nll_sum / count)."""
    if count <= 0:
        raise ValueError("perplexity of zero tokens")
    return math.exp(nll_sum / count)


def q_position(ppl_samples: float, ppl_real: float, ppl_shuffled: float) -> float:
    """Where the samples sit between real text (0) and shuffled characters (1):

    q = ln(PPL_samples / PPL_real) / ln(PPL_shuffled / PPL_real).

    Not clipped: q < 0 reads better than the real text, q > 1 worse than shuffled characters.
    """
    for name, v in (("samples", ppl_samples), ("real", ppl_real), ("shuffled", ppl_shuffled)):
        if not v > 0:
            raise ValueError(f"perplexity of {name} must be > 0, got {v}")
    denom = math.log(ppl_shuffled / ppl_real)
    if denom == 0:
        raise ValueError("shuffled and real perplexities are equal: q is undefined")
    return math.log(ppl_samples / ppl_real) / denom
