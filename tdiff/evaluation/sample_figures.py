"""Figures of generated texts, each a plain dict:

- ``samples``         diversity and length (see :func:`sample_metrics` for units).
- ``judge``           generative perplexity under a judge causal LM, and with real texts the real and
  shuffled-character perplexities and q (0 reads like real text, 1 like its characters shuffled).
- ``memorization``    4-gram overlap with the training data.
- ``references``      BLEU, ROUGE-L and lengths against references paired in order.
- ``control``         whether controlled samples kept their known text, filled their spans, met their length.
- ``labels``          label accuracy under a sentiment classifier.
"""

from __future__ import annotations

from pathlib import Path

from tdiff.core.errors import DataError, NoInputError, UsageError
from tdiff.evaluation import metrics as M
from tdiff.evaluation.model_figures import SCORE_BATCH
from tdiff.evaluation.records import TextRecords, first_record, iter_train_units
from tdiff.files.streams import display_name

REPLACEMENT = "\ufffd"


def units_of(texts, tok=None) -> list:
    """The token lists the diversity metrics count: the judge tokenizer's pieces (ids) when TOK is
    given, else characters (whitespace included: it is part of the text)."""
    if tok is None:
        return [list(t) for t in texts]
    return tok.encode_batch(list(texts))


def diversity(units) -> dict:
    """Unigram entropy (nats), distinct-1/2/3 and bigram repetition rate of token lists UNITS."""
    return {
        "unigram_entropy": M.unigram_entropy(units),
        "distinct_1": M.distinct_n(units, 1),
        "distinct_2": M.distinct_n(units, 2),
        "distinct_3": M.distinct_n(units, 3),
        "repetition_rate": M.repetition_rate(units, 2),
    }


def sample_metrics(texts, ids=None, tok=None, real_texts=None) -> dict:
    """Diversity and length metrics of generated TEXTS.

    Units: entropy, distinct-n and repetition rate count judge-tokenizer pieces when TOK is given,
    else characters ("units" says which). Self-BLEU uses sacrebleu's "zh" tokenizer (one token per
    CJK character, words otherwise) on the first 200 samples. Lengths are in characters, plus in
    tokens when the records carry ids. With REAL_TEXTS the same diversity numbers of the real texts
    (same units) and the entropy ratio samples/real are added (the quality bar: within 10%).
    """
    if not texts:
        raise DataError("no samples to evaluate")
    units = units_of(texts, tok)
    out = {"count": len(texts), "units": "judge_tokens" if tok is not None else "chars"}
    out.update(diversity(units))
    out["self_bleu"] = M.self_bleu(texts, tokenize="zh")
    out["length_chars"] = M.length_stats(len(t) for t in texts)
    if ids is not None:
        out["length_tokens"] = M.length_stats(len(s) for s in ids)
    out["empty_share"] = sum(not t for t in texts) / len(texts)
    out["replacement_char_share"] = sum(REPLACEMENT in t for t in texts) / len(texts)
    if real_texts:
        real = diversity(units_of(real_texts, tok))
        out["real"] = {**real, "count": len(real_texts), "length_chars": M.length_stats(len(t) for t in real_texts)}
        out["entropy_ratio"] = out["unigram_entropy"] / real["unigram_entropy"] if real["unigram_entropy"] else None
        real_mean = out["real"]["length_chars"]["mean"]
        out["length_ratio_real"] = (out["length_chars"]["mean"] / real_mean) if real_mean else None
    return out


def judge_metrics(model, tok, texts, real_texts=None, seed: int = 0, device=None, dtype: str = "fp32") -> dict:
    """Generative perplexity exp(Σ NLL / tokens) of TEXTS under a judge causal LM (re-tokenized with
    the judge's tokenizer; the eos after each text counts). With REAL_TEXTS also their perplexity,
    that of their shuffled-character version (metrics.shuffle_chars with SEED) and
    q = ln(PPL_samples/PPL_real) / ln(PPL_shuffled/PPL_real) (None when undefined)."""
    from tdiff.evaluation.perplexity import judge_nll

    def score(ts):
        nll, n = judge_nll(model, tok, ts, device=device, batch_size=SCORE_BATCH, dtype=dtype)
        return (M.ppl(nll, n) if n else float("nan")), n

    out = {}
    out["samples_ppl"], out["samples_tokens"] = score(texts)
    if real_texts:
        out["real_ppl"], out["real_tokens"] = score(real_texts)
        out["shuffled_ppl"], _ = score(M.shuffle_chars(real_texts, seed=seed))
        try:
            out["q"] = M.q_position(out["samples_ppl"], out["real_ppl"], out["shuffled_ppl"])
        except ValueError:
            out["q"] = None
        out["ppl_ratio"] = out["samples_ppl"] / out["real_ppl"]
    return out


def memorization(samples: TextRecords, train_path, n: int = 4) -> dict:
    """Share of the samples' n-grams (with multiplicity) found anywhere in the --train file.

    Over token ids when every sample record has ids and the training records have ids (both must
    come from the same tokenizer), else over characters of the texts ("units" says which).
    """
    if str(train_path) != "-" and not Path(train_path).exists():
        raise NoInputError(f"--train '{train_path}' does not exist")
    first = first_record(train_path)
    if first is None:
        raise DataError(f"{display_name(train_path)}: no training records")
    use_ids = samples.ids is not None and isinstance(first.get("ids"), list)
    if not use_ids and not isinstance(first.get("text"), str):
        raise DataError(f"{display_name(train_path)}:1: has no 'text' to compare the samples' characters with, "
                        "and the samples have no 'ids' (give texts, or samples with ids)")
    index = M.NgramSet(iter_train_units(train_path, use_ids), n)
    units = samples.ids if use_ids else [list(t) for t in samples.texts]
    return {"ngram_overlap": M.ngram_overlap(units, index, n), "n": n, "units": "ids" if use_ids else "chars",
            "train_ngrams": len(index)}


def reference_metrics(texts, refs) -> dict:
    """BLEU (sacrebleu, tokenize "zh") and character ROUGE-L of TEXTS against REFS paired in order
    (the first min(len) of each), and the mean-length ratio over all of both (characters)."""
    k = min(len(texts), len(refs))
    if k == 0:
        raise DataError("no sample/reference pairs to compare")
    hyps, rs = list(texts[:k]), list(refs[:k])
    return {
        "pairs": k,
        "bleu": M.bleu(hyps, rs, tokenize="zh"),
        "rouge_l": M.rouge_l(hyps, rs, char_level=True),
        "length_ratio": M.length_ratio([len(t) for t in texts], [len(t) for t in refs]),
        "length_chars": M.length_stats(len(t) for t in refs),
    }


def known_and_spans(source: str, mask) -> tuple[list[str], list[str]]:
    """The known parts of SOURCE around the MASK spans ([start, end] characters, in order), and the spans."""
    parts, spans, pos = [], [], 0
    for a, b in mask:
        parts.append(source[pos:a])
        spans.append(source[a:b])
        pos = b
    parts.append(source[pos:])
    return parts, spans


def filled_spans(text: str, parts: list[str]) -> list[str] | None:
    """What TEXT put between the known PARTS (kept in order: the first at the start, the last at the
    end); None when the known text is not all there."""
    if not text.startswith(parts[0]) or not text.endswith(parts[-1]) or len(text) < len(parts[0]) + len(parts[-1]):
        return None
    body, out, pos = text[len(parts[0]):len(text) - len(parts[-1])], [], 0
    for part in parts[1:-1]:
        i = body.find(part, pos)
        if i < 0:
            return None
        out.append(body[pos:i])
        pos = i + len(part)
    out.append(body[pos:])
    return out


def control_metrics(texts, requests) -> dict:
    """Kept-text fidelity of prompted and edited/infilled samples (share whose known text is there,
    verbatim and in place) and, for edits, character ROUGE-L and BLEU of the filled spans against the
    source's spans, and their length ratio."""
    prompts = [(t, q) for t, q in zip(texts, requests) if q is not None and "prompt" in q]
    edits = [(t, q) for t, q in zip(texts, requests) if q is not None and "source" in q]
    out = {}
    if prompts:
        kept = [t.startswith(q["prompt"]) for t, q in prompts]
        cont = [t[len(q["prompt"]):] for (t, q), k in zip(prompts, kept) if k]
        out["prompt"] = {"records": len(prompts), "kept": sum(kept) / len(prompts),
                         "continuation_chars": M.length_stats(len(c) for c in cont) if cont else None}
    if edits:
        hyps, refs, kept = [], [], 0
        for t, q in edits:
            parts, spans = known_and_spans(q["source"], q["mask"])
            got = filled_spans(t, parts)
            if got is not None:
                kept += 1
                hyps.append("".join(got))
                refs.append("".join(spans))
        e = {"records": len(edits), "kept": kept / len(edits)}
        if hyps:
            e.update(span_rouge_l=M.rouge_l(hyps, refs, char_level=True), span_bleu=M.bleu(hyps, refs, tokenize="zh"),
                     span_length_ratio=M.length_ratio([len(h) for h in hyps], [len(r) for r in refs]))
        out["edit"] = e
    return out


SENTIMENT_SIDES = {"pos": True, "positive": True, "neg": False, "negative": False}


def label_accuracy(texts, labels, classifier: str, where: str = "--samples") -> dict:
    """Label accuracy of (guided) samples under an external classifier: the share of the samples
    with a "label" whose text the classifier puts on that label's side, overall and per label.

    snownlp: the sentiment model the snownlp package ships (trained on product reviews), positive
    when ``SnowNLP(text).sentiments > 0.5``; labels pos/positive and neg/negative. An empty text
    counts as a miss. Samples without a label are not counted."""
    if classifier != "snownlp":
        raise UsageError(f"--classifier {classifier!r}: choose snownlp")
    try:
        from snownlp import SnowNLP
    except ImportError:
        raise UsageError("--classifier snownlp: the snownlp package is not installed (pip install snownlp)") from None
    pairs = [(t, lab) for t, lab in zip(texts, labels) if lab is not None]
    if not pairs:
        raise DataError(f"{where}: no record has a 'label' field (sample with --label, or give records with one)")
    unknown = sorted({lab for _, lab in pairs if lab.lower() not in SENTIMENT_SIDES})
    if unknown:
        raise UsageError(f"--classifier snownlp: labels must be pos/positive or neg/negative; "
                         f"{where} has {', '.join(map(repr, unknown[:5]))}")
    per: dict = {}
    for text, lab in pairs:
        hit = bool(text) and (SnowNLP(text).sentiments > 0.5) == SENTIMENT_SIDES[lab.lower()]
        n, k = per.get(lab, (0, 0))
        per[lab] = (n + 1, k + hit)
    total = sum(n for n, _ in per.values())
    return {"classifier": classifier, "records": total,
            "accuracy": round(sum(k for _, k in per.values()) / total, 4),
            "per_label": {lab: {"records": n, "accuracy": round(k / n, 4)} for lab, (n, k) in sorted(per.items())}}
