"""Sample quality on songci: tdiff vs real text vs the autoregressive baseline; prints JSON.

Runs bench/quality/prepare_songci.sh first when its models are missing (train or reuse), then:

- VAE: token accuracy and exact match on the held-out poems (2%, split by poem);
- for real held-out text, its shuffled-character version, AR-baseline samples and tdiff
  samples (dpm 12 steps, ddpm 200 steps, and dpm at 4/8/12/25/50 steps for the
  quality-vs-steps table): judge perplexity (GPT-2 judge from `tdiff train-ar`, texts
  re-tokenized with its tokenizer), q = ln(PPL/PPL_real) / ln(PPL_shuffled/PPL_real)
  (0 = reads like real text, 1 = like shuffled characters), character unigram entropy,
  KL(held-out ‖ set) of character unigrams, mean length in characters, distinct-2 and
  repetition over characters, share with U+FFFD, and memorization: longest substring
  shared with any one training text (suffix-array index, bench.quality.text_stats) and the
  share of character 4-grams found in the training text.
- the quality bars: PPL ratio ≤ 2, entropy within 10%, q ≤ 0.5, length within 10%.

Reference rows that calibrate the character KL: the shuffled held-out text has the same
unigram counts as the real held-out texts (the same KL by construction: unigram KL cannot
see word order), a random subset of training text with as many texts as the samples gives
the finite-sample floor of the KL for real text, and characters drawn uniformly from the
training text's character set give its scale for text with no unigram statistics.

Usage: python -m bench.quality.quality [--num 256] [--out bench_out/songci]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import time
from pathlib import Path

from bench.common import ROOT, SHARED, Judge, logger, n_params, print_json, read_texts, tdiff_params
from bench.quality.text_stats import SubstringIndex, char_unigram_kl, max_lcs_stats

log = logger("quality")


def read_ids(path: Path) -> list[list[int]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["ids"] for line in f if line.strip()]


class Scorer:
    """Everything measured on one set of texts, against held-out text, training text and a judge."""

    def __init__(self, judge: Judge, held: list[str], train: list[str]):
        from tdiff.evaluation.metrics import NgramSet

        self.judge, self.held = judge, held
        t0 = time.perf_counter()
        self.index = SubstringIndex(train)
        self.train_4grams = NgramSet([list(t) for t in train], 4)
        log(f"training-text indexes built in {time.perf_counter() - t0:.1f} s")

    def score(self, texts: list[str]) -> dict:
        from tdiff.evaluation import metrics as M

        chars = [list(t) for t in texts]
        lcs = max_lcs_stats(texts, self.index) if texts else {"mean": 0.0, "max": 0.0, "p50": 0.0}
        return {
            "n": len(texts),
            "judge_ppl": round(self.judge.ppl(texts), 3),
            "char_entropy": round(M.unigram_entropy(chars), 4),
            "char_kl_vs_heldout": round(char_unigram_kl(texts, self.held), 4),
            "mean_chars": round(sum(map(len, texts)) / max(1, len(texts)), 2),
            "distinct_2": round(M.distinct_n(chars, 2), 4),
            "repetition_2": round(M.repetition_rate(chars, 2), 4),
            "replacement_char_share": sum("\ufffd" in t for t in texts) / max(1, len(texts)),
            "lcs_with_train": {k: round(v, 2) for k, v in lcs.items()},
            "train_4gram_overlap": round(M.ngram_overlap(chars, self.train_4grams, 4), 4),
        }


def tdiff_samples(bundle, num: int, steps: int, solver: str, seed: int, dtype: str) -> tuple[list[str], float]:
    from tdiff.sampling.sample import SampleOptions, generate

    t0 = time.perf_counter()
    opts = SampleOptions(num=num, batch_size=64, steps=steps, solver=solver, seed=seed, dtype=dtype)
    texts = [r["text"] for r in generate(bundle, opts, bundle_device(bundle))]
    return texts, time.perf_counter() - t0


def bundle_device(bundle):
    return next(bundle.dit.parameters()).device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out/songci"))
    ap.add_argument("--num", type=int, default=256, help="samples per set")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="fp32", help="dtype for sampling and judging")
    ap.add_argument("--steps-table", default="4,8,12,25,50")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if not (out / "ar" / "config.json").exists():
        log(f"models missing in {out}: running bench/quality/prepare_songci.sh")
        subprocess.run(["bash", str(ROOT / "bench" / "quality" / "prepare_songci.sh")], check=True, cwd=ROOT,
                       env={**os.environ, "OUT": str(out.resolve()), "SHARED": str(SHARED.resolve())})

    from tdiff.sampling.ar import generate_ar
    from tdiff.formats.ar_dir import load_ar
    from tdiff.formats.model import load_model
    from tdiff.evaluation.metrics import q_position, shuffle_chars
    from tdiff.data.latents import reconstruction_metrics

    result: dict = {"corpus": "songci.txt (every 50th poem held out; chunks of at most 64 chars)",
                    "num_samples": args.num, "seed": args.seed, "threads": args.threads}
    bundle = load_model(out / "model.safetensors")
    vcfg = bundle.vae.config
    held_ids = read_ids(out / "held_ids.jsonl")
    t0 = time.perf_counter()
    rec = reconstruction_metrics(bundle.vae, held_ids, vcfg.max_len, bundle.tokenizer.pad_id, "cpu")
    result["vae_heldout"] = {**{k: round(v, 5) if isinstance(v, float) else v for k, v in rec.items()},
                             "eval_s": round(time.perf_counter() - t0, 2),
                             "train": {k: bundle.train.get("vae_train", {}).get(k)
                                       for k in ("steps", "elapsed_s", "heldout")}}
    result["dit_train"] = {k: bundle.train.get(k) for k in ("steps", "elapsed_s", "heldout_loss")}
    log(f"VAE held-out token accuracy {rec['token_accuracy']:.4f}")

    held = read_texts(out / "held.jsonl")
    train = read_texts(out / "text.jsonl")
    judge = Judge(out / "judge", args.dtype)
    scorer = Scorer(judge, held, train)
    rng = random.Random(args.seed)
    real = rng.sample(held, min(args.num, len(held)))

    sets: dict[str, dict] = {}
    sets["real_heldout"] = scorer.score(real)
    sets["shuffled_heldout"] = scorer.score(shuffle_chars(real, seed=args.seed))
    # Scale for the character KL: characters drawn uniformly from the training text's
    # character set, with the real texts' lengths (no unigram statistics at all).
    charset = sorted(set("".join(train)))
    sets["uniform_chars"] = scorer.score(["".join(rng.choice(charset) for _ in t) for t in real])
    sub = rng.sample(train, min(args.num, len(train)))
    sets["train_subset"] = scorer.score(sub)
    sets["train_subset"]["lcs_with_train"] = "n/a (its own texts are in the index)"

    ar, ar_tok = load_ar(out / "ar")
    t0 = time.perf_counter()
    ar_texts = [r["text"] for r in generate_ar(ar, ar_tok, args.num, batch_size=64, temperature=1.0,
                                               seed=args.seed, dtype=args.dtype)]
    sets["ar_baseline"] = scorer.score(ar_texts) | {"sample_s": round(time.perf_counter() - t0, 2)}
    result["parameters"] = {"tdiff_vae_plus_dit": tdiff_params(bundle)["total"], "ar_baseline": n_params(ar),
                        "judge": n_params(judge.model)}

    examples = {}
    for name, solver, steps in [("tdiff_dpm12", "dpm", 12), ("tdiff_ddpm200", "ddpm", 200)]:
        texts, dt = tdiff_samples(bundle, args.num, steps, solver, args.seed, args.dtype)
        sets[name] = scorer.score(texts) | {"sample_s": round(dt, 2)}
        examples[name] = texts[:5]
        log(f"{name}: judge PPL {sets[name]['judge_ppl']}")
    examples["ar_baseline"] = ar_texts[:5]

    r_ppl, s_ppl = sets["real_heldout"]["judge_ppl"], sets["shuffled_heldout"]["judge_ppl"]
    for v in sets.values():
        v["q"] = round(q_position(v["judge_ppl"], r_ppl, s_ppl), 4)
    result["sets"] = sets

    table = []
    for steps in [int(s) for s in args.steps_table.split(",") if s]:
        texts, dt = tdiff_samples(bundle, args.num, steps, "dpm", args.seed, args.dtype)
        s = scorer.score(texts)
        table.append({"solver": "dpm", "steps": steps, "judge_ppl": s["judge_ppl"],
                      "q": round(q_position(s["judge_ppl"], r_ppl, s_ppl), 4), "char_entropy": s["char_entropy"],
                      "char_kl_vs_heldout": s["char_kl_vs_heldout"], "mean_chars": s["mean_chars"],
                      "sample_s": round(dt, 2)})
        log(f"dpm {steps} steps: judge PPL {s['judge_ppl']}")
    result["quality_vs_steps"] = table

    real_s = sets["real_heldout"]
    bars = {}
    for name in ("tdiff_dpm12", "tdiff_ddpm200", "ar_baseline"):
        s = sets[name]
        bars[name] = {
            "ppl_ratio": round(s["judge_ppl"] / r_ppl, 3), "ppl_ratio_bar": 2.0,
            "entropy_rel_diff": round(s["char_entropy"] / real_s["char_entropy"] - 1, 4), "entropy_bar": 0.10,
            "q": s["q"], "q_bar": 0.5,
            "length_rel_diff": round(s["mean_chars"] / real_s["mean_chars"] - 1, 4), "length_bar": 0.10,
            "no_replacement_chars": s["replacement_char_share"] == 0,
        }
    result["bars"] = bars
    result["examples"] = examples
    print_json(result, indent=1)


if __name__ == "__main__":
    main()
