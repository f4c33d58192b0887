"""Quality at equal diversity: the quality–diversity frontier of tdiff models and AR baselines.

A lower judge perplexity bought with a lower entropy is not progress. So every system is
swept over one decoding knob (tdiff: the nucleus mass top-p of sampling the VAE decoder's logits,
0 = greedy, or its temperature with --tdiff-knob temperature; AR: the sampling temperature) and each point is scored by the same judge: judge perplexity
(per judge token) against character unigram entropy. The figure of merit is each system's
judge PPL *at the real text's entropy*, read off its frontier by linear interpolation of
ln PPL between the two knob points that bracket the real entropy (null when the sweep does
not bracket it: widen the sweep), and q = ln(PPL/PPL_real) / ln(PPL_shuffled/PPL_real) there.

Every point also counts empty samples and samples with U+FFFD and reports the mean length.
Systems are given as NAME=PATH (a tdiff `model.safetensors` or a `train-ar` directory); the
same NAME given several times is several seeds of one system, summarized as mean, min, max.
NAME=PATH@STEPS or NAME=PATH@STEPS:SOLVER samples that system with its own steps and solver
(default: --steps/--solver, or a `tdiff distill` student's own).

Usage:
  python -m bench.quality.frontier --judge bench_out/songci/judge --real bench_out/songci/held.jsonl \\
      --system tdiff=run0/model.safetensors --system tdiff=run1/model.safetensors \\
      --system ar=run0/ar --system ar=run1/ar --plot bench_out/frontier.png > frontier.json
  python -m bench.quality.frontier --merge runA/frontier.json runB/frontier.json --plot both.png   # no sampling
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

from bench.common import Judge, logger, print_json, read_texts, set_threads

log = logger("frontier")


def at_entropy(points: list[dict], h: float) -> float | None:
    """ln-linear interpolation of judge PPL at entropy H over POINTS [{"char_entropy", "judge_ppl"}].

    Uses the two points adjacent in entropy that bracket H (the frontier sorted by entropy);
    None when no pair brackets H."""
    pts = sorted((p["char_entropy"], math.log(p["judge_ppl"])) for p in points)
    for (h0, l0), (h1, l1) in zip(pts, pts[1:]):
        if h0 <= h <= h1:
            w = 0.0 if h1 == h0 else (h - h0) / (h1 - h0)
            return math.exp(l0 + w * (l1 - l0))
    return None


def spread(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": round(sum(xs) / len(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4), "n": len(xs)}


def describe(texts: list[str], judge: Judge) -> dict:
    from tdiff.evaluation.metrics import unigram_entropy

    return {"judge_ppl": round(judge.ppl(texts), 3),
            "char_entropy": round(unigram_entropy([list(t) for t in texts]), 4),
            "mean_chars": round(sum(map(len, texts)) / max(1, len(texts)), 2),
            "empty": sum(not t.strip() for t in texts),
            "replacement_char": sum("\ufffd" in t for t in texts)}


def system_texts(path: Path, knob: float, num: int, seed: int, steps: int, solver: str, dtype: str,
                 cache: dict, tdiff_knob: str = "top_p", **sample_kw) -> list[str]:
    """NUM samples of the system at PATH with decoding knob KNOB (AR: temperature; tdiff: TDIFF_KNOB)."""
    from tdiff.sampling.ar import generate_ar
    from tdiff.formats.ar_dir import is_ar_dir, load_ar

    if is_ar_dir(path):
        if path not in cache:
            cache[path] = load_ar(path)
        model, tok = cache[path]
        return [r["text"] for r in generate_ar(model, tok, num, batch_size=64, temperature=knob, seed=seed,
                                               dtype=dtype)]
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import SampleOptions, generate

    if path not in cache:
        cache[path] = load_model(path)
    if tdiff_knob == "top_p":                           # p = 0: greedy; else temperature 1 within the nucleus
        dec = {"temperature": 1.0 if knob > 0 else 0.0, "top_p": knob if knob > 0 else 1.0}
    else:
        dec = {"temperature": knob}
    opts = SampleOptions(num=num, batch_size=64, steps=steps, solver=solver, seed=seed, dtype=dtype, **dec,
                         **sample_kw)
    return [r["text"] for r in generate(cache[path], opts, "cpu")]


def plot(result: dict, path: Path) -> None:
    """The frontier figure (`tdiff plot frontier.json -o F.png` draws the same)."""
    from tdiff.evaluation.plots import frontier

    frontier(result, path)


def merge_plot(paths: list[Path], out: Path, title: str, only: set[str] | None = None) -> None:
    """Plot the runs of several frontier.json files (each scored with the same judge and real text)
    in one figure, without sampling again: `--merge A.json B.json … --plot F.png`."""
    from tdiff.core.errors import DataError
    from tdiff.evaluation.plots import merge_frontiers

    try:
        merged = merge_frontiers([json.loads(p.read_text()) for p in paths], [str(p) for p in paths])
    except DataError as e:
        sys.exit(f"frontier.py: {e}")
    runs = [r for r in merged["runs"] if only is None or r["system"] in only]
    plot({**merged, "runs": runs, "title": title}, out)


def add_sampling_args(ap: argparse.ArgumentParser) -> None:
    """The sampling options of a frontier sweep (knobs, sample count, seed, solver, dtype), shared by the
    benchmarks that score systems this way (bench.quality.ar_minutes)."""
    ap.add_argument("--tdiff-knob", default="top_p", choices=["top_p", "temperature"])
    ap.add_argument("--tdiff-knobs", default="0,0.5,0.8,0.9,0.95,1.0", help="decoder top-p (or temperatures)")
    ap.add_argument("--ar-knobs", default="0.7,0.85,1.0,1.15", help="AR sampling temperatures")
    ap.add_argument("--num", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--solver", default="dpm")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--time-grid", default="uniform", help="tdiff: solver time grid (uniform|logsnr|warp)")
    ap.add_argument("--round-x0", action="store_true", help="tdiff: snap x0 estimates through the VAE")
    ap.add_argument("--tdiff-decoder", default="auto", choices=["auto", "parallel", "contextual"],
                    help="tdiff: latents to tokens (auto: the VAE's own; parallel: the per-position head)")


def references(judge: Judge, real_path: Path, num: int, seed: int) -> tuple[dict, dict]:
    """describe() of NUM held-out texts of REAL_PATH drawn with SEED, and of the same texts with their
    characters shuffled (the q = 1 end)."""
    from tdiff.evaluation.metrics import shuffle_chars

    held = read_texts(real_path)
    real = random.Random(seed).sample(held, min(num, len(held)))
    return describe(real, judge), describe(shuffle_chars(real, seed=seed), judge)


def sampling_plan(path: Path, own: str, steps: int, solver: str, cache: dict) -> tuple[int, str]:
    """(steps, solver) of the tdiff model at PATH: OWN ("STEPS[:SOLVER]", may be empty) first, then a
    `tdiff distill` student's own plan, then STEPS and SOLVER."""
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import sampling_plan as plan

    if path not in cache:
        cache[path] = load_model(path)
    want_steps, _, want_solver = own.partition(":")
    student = cache[path].kind == "student"
    steps, solver, _ = plan(cache[path], int(want_steps) if want_steps else (None if student else steps),
                            want_solver or (None if student else solver))
    return steps, solver


def score_system(name: str, path: Path, own: str, args: argparse.Namespace, judge: Judge, cache: dict,
                 real: dict, shuffled: dict, examples: dict) -> dict:
    """The frontier run of one system: PATH (a `train-ar` directory or a tdiff model, sampled with OWN
    steps and solver, see `sampling_plan`) swept over its knobs of ARGS (`add_sampling_args`), each point
    scored by JUDGE; its PPL and q at the entropy of REAL (q against REAL and SHUFFLED). The first five
    texts of each point go into EXAMPLES."""
    from tdiff.evaluation.metrics import q_position
    from tdiff.formats.ar_dir import is_ar_dir

    r_ppl, s_ppl, h_real = real["judge_ppl"], shuffled["judge_ppl"], real["char_entropy"]
    ar = is_ar_dir(path)
    steps, solver = (args.steps, args.solver) if ar else sampling_plan(path, own, args.steps, args.solver, cache)
    knobs = [float(k) for k in (args.ar_knobs if ar else args.tdiff_knobs).split(",") if k]
    points = []
    for k in knobs:
        t0 = time.perf_counter()
        kw = {} if ar else {"time_grid": args.time_grid, "round_x0": args.round_x0, "decoder": args.tdiff_decoder}
        texts = system_texts(path, k, args.num, args.seed, steps, solver, args.dtype, cache,
                             args.tdiff_knob, **kw)
        d = describe(texts, judge) | {"knob": k, "sample_s": round(time.perf_counter() - t0, 2)}
        d["q"] = round(q_position(d["judge_ppl"], r_ppl, s_ppl), 4)
        points.append(d)
        examples.setdefault(f"{name} {path} knob {k:g}", texts[:5])
        log(f"{name} {path} knob {k:g}: PPL {d['judge_ppl']:.1f} entropy {d['char_entropy']:.3f} "
            f"(real {h_real:.3f}) length {d['mean_chars']} empty {d['empty']}")
    ppl_at = at_entropy(points, h_real)
    return {"system": name, "path": str(path), "kind": "ar" if ar else "tdiff", "points": points,
            **({} if ar else {"steps": steps, "solver": solver}),
            "ppl_at_real_entropy": None if ppl_at is None else round(ppl_at, 3),
            "q_at_real_entropy": None if ppl_at is None else round(q_position(ppl_at, r_ppl, s_ppl), 4)}


def main() -> None:
    if "--merge" in sys.argv:
        ap = argparse.ArgumentParser(description="plot several frontier.json files together")
        ap.add_argument("--merge", nargs="+", type=Path, required=True)
        ap.add_argument("--plot", type=Path, required=True)
        ap.add_argument("--title", default="")
        ap.add_argument("--only", default="", help="comma-separated system names (seed suffix _sK dropped)")
        a = ap.parse_args()
        merge_plot(a.merge, a.plot, a.title, set(a.only.split(",")) if a.only else None)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--judge", required=True, type=Path)
    ap.add_argument("--real", required=True, type=Path, help="held-out text JSONL ({'text': ...})")
    ap.add_argument("--system", action="append", default=[], help="NAME=PATH (repeat; same NAME = seeds)")
    add_sampling_args(ap)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--title", default="")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    set_threads(args.threads)
    judge = Judge(args.judge, args.dtype)
    real, shuffled = references(judge, args.real, args.num, args.seed)
    result = {"num": args.num, "seed": args.seed, "steps": args.steps, "solver": args.solver, "title": args.title,
              "tdiff_knob": args.tdiff_knob, "time_grid": args.time_grid, "round_x0": args.round_x0,
              "tdiff_decoder": args.tdiff_decoder,
              "real": real, "shuffled": shuffled}
    runs, cache, examples = [], {}, {}
    for spec in args.system:
        name, _, p = spec.partition("=")
        p, _, own = p.partition("@")
        runs.append(score_system(name, Path(p), own, args, judge, cache, real, shuffled, examples))
    result["runs"] = runs
    summary = {}
    for name in dict.fromkeys(r["system"] for r in runs):
        rs = [r for r in runs if r["system"] == name]
        summary[name] = {"ppl_at_real_entropy": spread([r["ppl_at_real_entropy"] for r in rs]),
                         "q_at_real_entropy": spread([r["q_at_real_entropy"] for r in rs])}
    result["summary"] = summary
    result["examples"] = examples
    if args.plot:
        plot(result, args.plot)
        log(f"wrote {args.plot}")
    print_json(result, indent=1)


if __name__ == "__main__":
    main()
