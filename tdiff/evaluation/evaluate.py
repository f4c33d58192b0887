"""Evaluation: one function per mode, each returning a plain dict of metrics.

Modes (the command combines any of them into one JSON object, one key per group):

- ``reconstruction``  VAE token accuracy and exact-match rate on held-out ids (posterior mean decoded
  greedily; accuracy counts the text positions and the pad that ends the text).
- ``noise_levels``    per noise level t: token accuracy of decoding the noisy latent directly and of
  decoding the denoiser's x0 estimate, and the denoiser's loss (where the denoiser adds information).
- ``denoising``       held-out denoising loss of a diffusion model: the MSE of its training target
  (x0, eps or v) on fresh noise, with no conditioning span and no self-conditioning, averaged over
  ``t_samples`` passes, each drawing stratified t across a batch (a fixed seed: the same number every run).
- ``perplexity``      held-out perplexity of a ``train-ar`` model, exp(Σ NLL / tokens), scoring the ids
  and the eos after [bos].
- ``samples``         diversity and length of generated texts (see :func:`sample_metrics` for units).
- ``judge``           generative perplexity of the samples under a judge causal LM, and with real texts
  the real and shuffled-character perplexities and q (0 reads like real text, 1 like its characters shuffled).
- ``memorization``    4-gram overlap of the samples with the training data.
- ``references``      BLEU, ROUGE-L and lengths against references paired in order.
- ``speed``           tokens/s and per-batch latency percentiles of sampling.

Nothing here parses options or prints; ``tdiff.commands.eval`` does that.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from tdiff.evaluation import metrics as M
from tdiff.core.errors import DataError, NoInputError, UsageError
from tdiff.files.streams import display_name, iter_jsonl, require_field

SCORE_BATCH = 64          # sequences per forward pass when scoring (not timed)
REPLACEMENT = "\ufffd"


# ---------------------------------------------------------------------------
# reading inputs


@dataclass
class TextRecords:
    """Texts of a JSONL file, with their ids when every record has an 'ids' list."""

    path: str
    texts: list
    ids: list | None          # list[list[int]] when every record has ids, else None
    requests: list | None = None   # per record, the control request it answers ({"prompt"} or {"source", "mask"}) or None
    labels: list | None = None     # per record, its "label" (str) or None; None when no record has one


def read_texts(path, need_text: bool = True, max_records: int = 0, opt: str = "input") -> TextRecords:
    """Records {"text": str, optionally "ids": [int]} from PATH (missing file: exit 66, bad line: exit 65).

    With NEED_TEXT false a record may have ids only (its text is then "").
    """
    name = display_name(path)
    if path is not None and str(path) != "-" and not Path(path).exists():
        raise NoInputError(f"{opt} file '{path}' does not exist")
    texts, ids, all_ids = [], [], True
    requests, labels = [], []
    for n, rec in iter_jsonl(path):
        if max_records and len(texts) >= max_records:
            break
        if need_text or "ids" not in rec:
            texts.append(require_field(rec, "text", str, name, n))
        else:
            t = rec.get("text", "")
            texts.append(t if isinstance(t, str) else "")
        r = rec.get("ids")
        if isinstance(r, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in r):
            ids.append(r)
        elif r is not None:
            raise DataError(f"{name}:{n}: field 'ids' must be a list of integers")
        else:
            all_ids = False
        requests.append(_request_of(rec, name, n))
        lab = rec.get("label")
        if lab is not None and not isinstance(lab, str):
            raise DataError(f"{name}:{n}: field 'label' must be a string")
        labels.append(lab)
    return TextRecords(name, texts, ids if all_ids and texts else None,
                       requests if any(q is not None for q in requests) else None,
                       labels if any(x is not None for x in labels) else None)


def _request_of(rec: dict, name: str, n: int) -> dict | None:
    """The control request a sample record of `tdiff sample` carries: {"prompt"}, {"source", "mask"}, or None."""
    if isinstance(rec.get("prompt"), str):
        return {"prompt": rec["prompt"]}
    if isinstance(rec.get("source"), str) and "mask" in rec:
        mask = rec["mask"]
        ok = isinstance(mask, list) and all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(v, int) for v in m) for m in mask)
        if not ok:
            raise DataError(f"{name}:{n}: field 'mask' must be a list of [start, end] character offsets")
        return {"source": rec["source"], "mask": mask}
    return None


def read_heldout_ids(path, vocab_size: int, max_records: int = 0) -> list:
    """Token sequences of an ids JSONL file; ids outside VOCAB_SIZE are a DataError naming the line."""
    from tdiff.data.token_ids import read_ids

    if str(path) != "-" and not Path(path).exists():
        raise NoInputError(f"--data '{path}' does not exist")
    seqs = read_ids(path, vocab_size=vocab_size).seqs
    if max_records:
        seqs = seqs[:max_records]
    if not seqs:
        raise DataError(f"{display_name(path)}: no non-empty 'ids' records to evaluate on")
    return seqs


def model_kind(path) -> str:
    """'ar' (a train-ar directory), 'model' (VAE + denoiser) or 'vae' for --model PATH."""
    from tdiff.formats.ar_dir import check_ar_dir
    from tdiff.files.artifacts import read_metadata

    p = Path(path)
    if not p.exists():
        raise NoInputError(f"--model '{p}' does not exist")
    if p.is_dir():
        check_ar_dir(p)
        return "ar"
    meta = read_metadata(p)
    try:
        config = json.loads(meta.get("config", "{}"))
    except ValueError:
        raise DataError(f"{p}: bad config metadata") from None
    kind = meta.get("tdiff.kind")
    if kind not in ("vae", "model", "student"):
        raise DataError(f"{p}: is a {kind!r} file; give a vae or model file, or a train-ar directory")
    return "model" if "dit" in config else "vae"


# ---------------------------------------------------------------------------
# held-out data


def reconstruction(vae, tok, seqs, device, dtype: str = "fp32") -> dict:
    """{"token_accuracy", "exact_match", "sequences", "truncated"} of the VAE on SEQS."""
    from tdiff.core.device import autocast
    from tdiff.data.latents import reconstruction_metrics

    max_len = vae.config.max_len
    with autocast(device, dtype):
        out = reconstruction_metrics(vae, seqs, max_len, tok.pad_id, device, batch_size=SCORE_BATCH)
    out["truncated"] = sum(len(s) > max_len for s in seqs)     # longer than the VAE's max_len: cut
    out["max_len"] = max_len
    return out


def denoising(bundle, seqs, device, seed: int = 0, t_samples: int = 4, dtype: str = "fp32") -> dict:
    """Held-out denoising loss: the mean over T_SAMPLES passes over SEQS of the per-example loss of
    tdiff.diffusion.losses (no conditioning span, no self-conditioning, stratified t, fresh noise)."""
    import torch

    from tdiff.core.device import autocast
    from tdiff.diffusion.losses import mean_denoising_loss
    from tdiff.data.latents import encode_latents
    from tdiff.core.seeds import generator

    if t_samples < 1:
        raise UsageError("--t-samples must be at least 1")
    vae, tok = bundle.vae, bundle.tokenizer
    lat = encode_latents(vae, seqs, vae.config.max_len, tok.pad_id, device, batch_size=SCORE_BATCH)  # (N, Lz, Dz)
    target = bundle.diffusion.get("target", "v")
    g = generator(seed, 0, "eval", device)
    with torch.no_grad(), autocast(device, dtype):
        per_pass = [mean_denoising_loss(bundle.dit, bundle.schedule, lat, target=target, generator=g,
                                        batch_size=SCORE_BATCH) for _ in range(t_samples)]
    return {"loss": sum(per_pass) / len(per_pass), "target": target, "t_samples": t_samples, "sequences": len(seqs),
            "loss_std_over_passes": _std(per_pass)}


NOISE_LEVELS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)


def check_noise_levels(levels) -> tuple:
    """LEVELS as a tuple of floats, each strictly between 0 and 1; a UsageError naming --noise-levels otherwise."""
    levels = tuple(float(t) for t in levels)
    bad = [t for t in levels if not 0 < t < 1]
    if not levels or bad:
        raise UsageError(f"--noise-levels: each level must be strictly between 0 and 1 (got {bad or 'none'})")
    return levels


def noise_levels(bundle, seqs, device, levels=NOISE_LEVELS, seed: int = 0, dtype: str = "fp32") -> dict:
    """Where the denoiser adds information: for each noise level t, the held-out latents are noised to
    x_t = α_t x0 + σ_t ε and decoded through the VAE two ways,

      naive     x_t / α_t, no network (what the noisy input alone already says),
      denoiser  the network's x0 estimate (one pass, no self-conditioning, no known span),

    with the token accuracy of each on the text positions (pads excluded), their difference
    ("gain"), and the denoiser's loss at that t (the training target's MSE). Same noise for both.
    Returns {"by_t": {"0.5": {...}, ...}, "tokens", "sequences"}.
    """
    import torch

    from tdiff.data.token_ids import pad_batch
    from tdiff.core.device import autocast
    from tdiff.diffusion.losses import diffusion_loss
    from tdiff.data.latents import encode_latents
    from tdiff.core.seeds import generator

    levels = check_noise_levels(levels)
    vae, tok = bundle.vae, bundle.tokenizer
    max_len = vae.config.max_len
    lat = encode_latents(vae, seqs, max_len, tok.pad_id, device, batch_size=SCORE_BATCH)   # (M, N, D)
    ids = pad_batch(seqs, max_len, tok.pad_id)                                              # (M, L)
    text = ids != tok.pad_id                                                                # (M, L)
    n_tok = int(text.sum())
    target = bundle.diffusion.get("target", "v")
    g = generator(seed, 0, "eval", device)
    by_t = {}
    with torch.no_grad(), autocast(device, dtype):
        for lvl in levels:
            correct = {"naive": 0, "denoiser": 0}
            loss_sum = 0.0
            for i in range(0, len(lat), SCORE_BATCH):
                x0 = lat[i:i + SCORE_BATCH]                                                 # (B, N, D)
                t = torch.full((len(x0),), float(lvl), dtype=torch.float64, device=device)  # (B,)
                terms = diffusion_loss(bundle.dit, bundle.schedule, x0, target=target, generator=g, t=t,
                                       estimates=True)
                a = terms.alpha.to(x0.dtype)[:, None, None]                                 # (B, 1, 1)
                want = ids[i:i + SCORE_BATCH].to(device)                                    # (B, L)
                keep = text[i:i + SCORE_BATCH].to(device)                                   # (B, L)
                for which, z in (("naive", terms.x_t.float() / a), ("denoiser", terms.x0_hat.float())):
                    pred = vae.decode(vae.denormalize(z)).argmax(-1)                        # (B, L)
                    correct[which] += int(((pred == want) & keep).sum())
                loss_sum += float(terms.mse.sum())
            acc = {k: v / max(1, n_tok) for k, v in correct.items()}
            lam = float(bundle.schedule.log_snr(torch.tensor([lvl], dtype=torch.float64, device=device)))
            by_t[f"{lvl:g}"] = {"log_snr": lam, "naive_accuracy": acc["naive"], "denoiser_accuracy": acc["denoiser"],
                                "gain": acc["denoiser"] - acc["naive"], "loss": loss_sum / len(lat)}
    return {"by_t": by_t, "tokens": n_tok, "sequences": len(seqs), "target": target}


def _std(xs) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def ar_perplexity(model, seqs, device, dtype: str = "fp32") -> dict:
    """{"perplexity", "nll_per_token", "tokens", "sequences"} of a train-ar model on SEQS."""
    from tdiff.evaluation.perplexity import heldout_perplexity

    if max(max(s) for s in seqs) >= model.config.vocab_size:
        raise DataError(f"token ids outside the AR model's vocabulary ({model.config.vocab_size})")
    p, nll, n = heldout_perplexity(model, seqs, device=device, batch_size=SCORE_BATCH, dtype=dtype)
    return {"perplexity": p, "nll_per_token": nll / n if n else float("nan"), "tokens": n, "sequences": len(seqs)}


# ---------------------------------------------------------------------------
# samples


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


def iter_train_units(path, use_ids: bool):
    """Token lists of the --train file: its 'ids' when USE_IDS, else the characters of its 'text'."""
    name = display_name(path)
    for n, rec in iter_jsonl(path):
        if use_ids:
            yield require_field(rec, "ids", list, name, n)
        else:
            yield list(require_field(rec, "text", str, name, n))


def first_record(path) -> dict | None:
    for _, rec in iter_jsonl(path):
        return rec
    return None


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


# ---------------------------------------------------------------------------
# speed


def _sync(device):
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def _timing(times, positions_per_run, generated) -> dict:
    total = sum(times)
    lat = M.latency_percentiles(times)
    return {"tokens_per_s": positions_per_run * len(times) / total,
            "generated_tokens_per_s": generated / total,
            "latency_p50_s": lat["p50"], "latency_p95_s": lat["p95"], "latency_mean_s": lat["mean"]}


def timed_diffusion_batch(bundle, batch_size: int, opts, generator, device):
    """(seconds, ids (B, L) on the CPU) of one batch through the sampling path of `tdiff sample`:
    noise → solver → VAE decoder → token ids. The clock includes the copy to the CPU."""
    from tdiff.sampling.sample import latents_to_ids, sample_latents

    _sync(device)
    t0 = time.perf_counter()
    z = sample_latents(bundle, batch_size, opts, generator, device)            # (B, N, D)
    ids = latents_to_ids(bundle, z, opts, generator).cpu()                     # (B, L)
    _sync(device)
    return time.perf_counter() - t0, ids


def timed_ar_batch(model, batch_size: int, length: int, device, dtype: str = "fp32"):
    """(seconds, ids (B, 1 + LENGTH) on the CPU) of one batched `generate` from [bos]: greedy, KV cache,
    exactly LENGTH new tokens (min_new_tokens = max_new_tokens), inference mode, DTYPE autocast."""
    import torch
    from transformers import GenerationConfig

    from tdiff.models.ar import quiet_transformers
    from tdiff.core.device import autocast

    c = model.config
    gconf = GenerationConfig(max_new_tokens=length, min_new_tokens=length, use_cache=True, do_sample=False,
                             bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, pad_token_id=c.pad_token_id)
    prompt = torch.full((batch_size, 1), c.bos_token_id, dtype=torch.long, device=device)   # (B, 1)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode(), autocast(device, dtype), quiet_transformers():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=gconf)
    out = out.cpu()                                                            # (B, 1 + length)
    _sync(device)
    return time.perf_counter() - t0, out


def speed_diffusion(bundle, device, steps: int = 12, solver: str = "dpm", batch_size: int = 1,
                    repeats: int = 5, warmup: int = 1, seed: int = 0, dtype: str = "fp32",
                    compile: bool = False) -> dict:
    """Time WARMUP untimed then REPEATS timed batches of BATCH_SIZE samples (noise → latents → ids).

    tokens/s counts every position of the fixed sequence length (batch × max_len per batch: the work
    done); generated_tokens_per_s counts the tokens left after cutting at the predicted end of text.
    With COMPILE the networks run through torch.compile (tdiff/sampling/compiled.py); the first warm-up batch
    then includes the compiling, reported as warmup_s.
    """
    from tdiff.sampling.sample import SampleOptions, check_options, trim_ids
    from tdiff.core.seeds import generator

    _check_speed(batch_size, repeats, warmup)
    opts = SampleOptions(num=batch_size, batch_size=batch_size, steps=steps, solver=solver, seed=seed, dtype=dtype)
    check_options(opts)
    if compile:
        from tdiff.sampling.compiled import compile_bundle

        bundle = compile_bundle(bundle, device, batch_size)
    length = bundle.vae.config.max_len
    times, warm, generated = [], [], 0
    for r in range(warmup + repeats):
        g = generator(seed, r, "sample", device)
        dt, ids = timed_diffusion_batch(bundle, batch_size, opts, g, device)
        if r >= warmup:
            times.append(dt)
            generated += sum(len(trim_ids(row, bundle.tokenizer)) for row in ids.tolist())
        else:
            warm.append(round(dt, 4))
    out = {"kind": "diffusion", "solver": solver, "steps": steps, "batch_size": batch_size, "length": length,
           "repeats": repeats, "warmup": warmup, "warmup_s": warm, "dtype": dtype, "compile": compile,
           "device": str(device)}
    out.update(_timing(times, batch_size * length, generated))
    return out


def speed_ar(model, tok, device, length: int = 128, batch_size: int = 1, repeats: int = 5, warmup: int = 1,
             seed: int = 0, dtype: str = "fp32") -> dict:
    """Time transformers `generate` (KV cache, greedy) producing exactly LENGTH new tokens per sequence
    (min_new_tokens = max_new_tokens) from [bos], WARMUP untimed then REPEATS timed batches."""
    import torch

    from tdiff.core.seeds import derive_seed

    _check_speed(batch_size, repeats, warmup)
    limit = model.config.n_positions - 1
    if length <= 0:
        length = min(128, limit)
    if length > limit:
        raise UsageError(f"--length {length}: at most {limit} new tokens fit this model's {limit + 1} positions")
    times, generated = [], 0
    model.eval()
    for r in range(warmup + repeats):
        torch.manual_seed(derive_seed(seed, r))
        dt, out = timed_ar_batch(model, batch_size, length, device, dtype)
        if r >= warmup:
            times.append(dt)
            generated += int(out.shape[0] * (out.shape[1] - 1))
    res = {"kind": "ar", "batch_size": batch_size, "length": length, "repeats": repeats, "warmup": warmup,
           "dtype": dtype, "device": str(device)}
    res.update(_timing(times, batch_size * length, generated))
    return res


def _check_speed(batch_size, repeats, warmup):
    if batch_size < 1 or repeats < 1 or warmup < 0:
        raise UsageError("--speed needs --batch-size ≥ 1, --repeats ≥ 1 and --warmup-batches ≥ 0")
