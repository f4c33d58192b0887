"""AR-equivalent minutes: how many minutes of AR-baseline training buy the quality a tdiff model reaches.

The AR baseline (GPT-2, `tdiff train-ar`) is trained from scratch at several time budgets by
bench/quality/ar_ladder.sh (LADDER/ar_<M>min/ar; one ladder per seed). Every AR budget and every
system (NAME=PATH, the same NAME repeated = seeds) is scored as bench.quality.frontier scores it:
swept over its decoding knob, judge perplexity read off the frontier at the real text's character
entropy. The AR curve is the seed-mean ln PPL at the real entropy against ln minutes. A system's
AR-equivalent minutes are where that curve first reaches the system's PPL, piecewise linear in
(ln minutes, ln PPL) between the bracketing budgets (null with a bound, "< M_min" or "> M_max", outside
the ladder), and its compute multiplier is --minutes (its own training minutes) / AR-equivalent minutes,
for each seed of the system against the seed-mean AR curve. Also per system: the equal-minutes ratio
PPL_system / PPL_AR(--minutes) (null unless that budget is in the ladder), the entropy, length (as a
ratio to the real texts' mean length), empty and U+FFFD counts at each knob, and the bars: multiplier
≤ 4 (goal ≤ 2), equal-minutes ratio ≤ 2.5, mean length within 10% of real at the knob nearest the real
entropy, no empty sample and no U+FFFD at any knob. --speed adds tokens/s of sampling at batch 1 and 64
(`tdiff eval --speed`'s timer; bf16 where the CPU has fast bf16, else fp32) for every system's first seed
and the largest AR budget. JSON on stdout (self-sufficient: --merge recomputes everything from it),
a markdown table and progress on stderr.

Usage:
  python -m bench.quality.ar_minutes --judge bench_out/songci/judge --real bench_out/songci/held.jsonl \\
      --ladder bench_out/ladder/s0 --ladder bench_out/ladder/s1 \\
      --system tdiff=runs/t0/model.safetensors --system tdiff=runs/t1/model.safetensors \\
      --minutes 20 --speed --plot bench_out/ar_minutes.png > ar_minutes.json
  python -m bench.quality.ar_minutes --merge a.json b.json --plot both.png     # re-tabulate, no sampling
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from bench.common import Judge, logger, print_json, set_threads
from bench.quality.frontier import add_sampling_args, references, score_system, spread

log = logger("ar_minutes")
BARS = {"multiplier": 4.0, "multiplier_goal": 2.0, "equal_minutes_ratio": 2.5, "length": 0.10}
SPEED_BATCHES = (1, 64)
BUDGET_DIR = re.compile(r"ar_(\d+(?:\.\d+)?)min")


# ---------------------------------------------------------------------------
# the curve and the figures read off it (pure functions on numbers)


def equivalent_minutes(curve: list[tuple[float, float]], ppl: float) -> tuple[float | None, tuple | None]:
    """(minutes, None) where the AR CURVE [(minutes, PPL)], sorted by minutes, first reaches PPL, piecewise
    linear in (ln minutes, ln PPL); (None, ("<", M_min)) when PPL is above the smallest budget's PPL,
    (None, (">", M_max)) when the curve never gets down to it."""
    m0, p0 = curve[0]
    if ppl >= p0:
        return (m0, None) if ppl == p0 else (None, ("<", m0))
    for (m0, p0), (m1, p1) in zip(curve, curve[1:]):
        if p1 <= ppl:                                   # first budget at or below PPL; p0 > PPL here
            w = math.log(p0 / ppl) / math.log(p0 / p1)
            return math.exp(math.log(m0) + w * math.log(m1 / m0)), None
    return None, (">", curve[-1][0])


def multiplier(train_minutes: float, minutes: float | None, bound: tuple | None) -> dict:
    """The compute multiplier TRAIN_MINUTES / MINUTES, or its bound when MINUTES is only BOUND ("<", M)
    (then it is > TRAIN/M) or (">", M) (< TRAIN/M), with the interval [low, high] it lies in (high None:
    unbounded; a bound's own edge excluded)."""
    if minutes is not None:
        m = train_minutes / minutes
        return {"value": m, "bound": None, "range": [m, m]}
    if bound is None:
        return {"value": None, "bound": None, "range": [None, None]}
    edge = train_minutes / bound[1]
    if bound[0] == "<":
        return {"value": None, "bound": f"> {edge:.4g}", "range": [edge, None]}
    return {"value": None, "bound": f"< {edge:.4g}", "range": [0.0, edge]}


def ar_curve(ladder_runs: list[dict]) -> dict:
    """The AR curve of the scored ladder runs (each {"ladder", "minutes", "ppl_at_real_entropy"}): per
    budget the seed-mean of ln PPL at the real entropy (budgets no seed brackets are left out), and each
    ladder's own curve."""
    by_minutes, per_seed = {}, {}
    for r in sorted(ladder_runs, key=lambda r: r["minutes"]):
        per_seed.setdefault(r["ladder"], []).append([r["minutes"], r["ppl_at_real_entropy"]])
        if r["ppl_at_real_entropy"] is not None:
            by_minutes.setdefault(r["minutes"], []).append(math.log(r["ppl_at_real_entropy"]))
    return {"minutes": list(by_minutes), "ppl": [round(math.exp(sum(v) / len(v)), 3) for v in by_minutes.values()],
            "seeds": [len(v) for v in by_minutes.values()], "per_seed": per_seed}


def seed_figures(ppl: float | None, curve: dict, train_minutes: float) -> dict:
    """One system seed at PPL (judge PPL at the real entropy) against the AR CURVE: AR-equivalent minutes
    (or bound), multiplier (or bound) and the equal-minutes ratio PPL / PPL_AR(TRAIN_MINUTES)."""
    pairs = list(zip(curve["minutes"], curve["ppl"]))
    minutes, bound = equivalent_minutes(pairs, ppl) if ppl is not None and pairs else (None, None)
    at = dict(pairs).get(train_minutes)
    return {"ppl_at_real_entropy": ppl, "ar_equivalent_minutes": minutes,
            "ar_equivalent_bound": None if bound is None else f"{bound[0]} {bound[1]:g}",
            "multiplier": multiplier(train_minutes, minutes, bound),
            "equal_minutes_ratio": None if ppl is None or at is None else ppl / at}


def at_most(ranges: list[list], limit: float) -> dict:
    """Whether the mean of quantities each known to lie in RANGES [low, high] (`multiplier`'s ranges; high
    None: unbounded and low excluded) is ≤ LIMIT: true, false, or null when the ranges leave it open; with
    the mean (when all are exact)."""
    if not ranges:
        return {"pass": None, "value": None}
    low = sum(lo for lo, _ in ranges) / len(ranges)
    open_low = any(hi is None for _, hi in ranges)
    high = None if open_low else sum(hi for _, hi in ranges) / len(ranges)
    verdict = True if high is not None and high <= limit else (False if low > limit or open_low and low >= limit
                                                               else None)
    return {"pass": verdict, "value": round(low, 4) if high == low else None, "range": [round(low, 4),
            None if high is None else round(high, 4)]}


def knob_table(runs: list[dict], real_chars: float) -> list[dict]:
    """Per knob over the seeds RUNS of one system: mean judge PPL, entropy and length ratio to the real
    mean length REAL_CHARS; empty and U+FFFD samples summed."""
    rows = {}
    for run in runs:
        for p in run["points"]:
            rows.setdefault(p["knob"], []).append(p)
    mean = lambda ps, k: sum(p[k] for p in ps) / len(ps)
    return [{"knob": k, "judge_ppl": round(mean(ps, "judge_ppl"), 3),
             "char_entropy": round(mean(ps, "char_entropy"), 4),
             "length_ratio": round(mean(ps, "mean_chars") / real_chars, 4), "empty": sum(p["empty"] for p in ps),
             "replacement_char": sum(p["replacement_char"] for p in ps), "seeds": len(ps)} for k, ps in rows.items()]


def nearest_length_ratio(run: dict, real: dict) -> float:
    """Mean sample length / the real texts' mean length at RUN's knob whose entropy is nearest the real one."""
    p = min(run["points"], key=lambda p: abs(p["char_entropy"] - real["char_entropy"]))
    return p["mean_chars"] / real["mean_chars"]


def bars(seeds: list[dict], runs: list[dict], real: dict) -> dict:
    """The bar checks of one system: {"pass": true/false/null, "value": the figure} each."""
    ranges = [s["multiplier"]["range"] for s in seeds if s["multiplier"]["range"][0] is not None]
    ratios = [s["equal_minutes_ratio"] for s in seeds]
    lengths = [nearest_length_ratio(r, real) for r in runs]
    worst = max(lengths, key=lambda x: abs(x - 1))
    empty = sum(p["empty"] for r in runs for p in r["points"])
    fffd = sum(p["replacement_char"] for r in runs for p in r["points"])
    ratio = None if None in ratios else sum(ratios) / len(ratios)
    return {"multiplier_le_4": at_most(ranges, BARS["multiplier"]),
            "multiplier_le_2_goal": at_most(ranges, BARS["multiplier_goal"]),
            "equal_minutes_ratio_le_2.5": {"pass": None if ratio is None else ratio <= BARS["equal_minutes_ratio"],
                                           "value": None if ratio is None else round(ratio, 4)},
            "length_within_10pct": {"pass": abs(worst - 1) <= BARS["length"], "value": round(worst, 4)},
            "no_empty": {"pass": empty == 0, "value": empty},
            "no_replacement_char": {"pass": fffd == 0, "value": fffd}}


def summarize_system(runs: list[dict], curve: dict, real: dict, minutes: float | None = None) -> dict:
    """The figures of one system from its seed RUNS (frontier runs with "train_minutes"; MINUTES overrides)."""
    train = minutes if minutes is not None else runs[0]["train_minutes"]
    seeds = [{"path": r["path"], **seed_figures(r["ppl_at_real_entropy"], curve, train)} for r in runs]
    return {"kind": runs[0]["kind"], "seeds": len(runs), "train_minutes": train,
            "ppl_at_real_entropy": spread([s["ppl_at_real_entropy"] for s in seeds]),
            "ar_equivalent_minutes": spread([s["ar_equivalent_minutes"] for s in seeds]),
            "multiplier": spread([s["multiplier"]["value"] for s in seeds]),
            "equal_minutes_ratio": spread([s["equal_minutes_ratio"] for s in seeds]),
            "per_seed": seeds, "knobs": knob_table(runs, real["mean_chars"]), "bars": bars(seeds, runs, real),
            "speed": next((r["speed"] for r in runs if "speed" in r), None)}


def analyse(result: dict, minutes: float | None = None) -> dict:
    """RESULT (real, runs) with its AR curve, per-system figures and markdown table added."""
    ladder = [r for r in result["runs"] if r["role"] == "ladder"]
    curve = ar_curve(ladder)
    names = dict.fromkeys(r["system"] for r in result["runs"] if r["role"] == "system")
    systems = {n: summarize_system([r for r in result["runs"] if r["role"] == "system" and r["system"] == n],
                                   curve, result["real"], minutes) for n in names}
    out = {**result, "ar_curve": curve, "systems": systems}
    out["table"] = table(out)
    return out


# ---------------------------------------------------------------------------
# the markdown table


def _cell(d: dict, n: int = 1) -> str:
    """A spread {"mean", "min", "max"} as `mean (min–max)`, `–` when empty."""
    if d["mean"] is None:
        return "–"
    return f"{d['mean']:.{n}f}" if d["min"] == d["max"] else f"{d['mean']:.{n}f} ({d['min']:.{n}f}–{d['max']:.{n}f})"


def _seed_cell(seeds: list[dict], key: str, bound: str, n: int = 1) -> str:
    """Per-seed values of KEY (or the BOUND text where a seed is outside the ladder), comma-separated."""
    return ", ".join(f"{s[key]:.{n}f}" if s[key] is not None else (s[bound] or "–") for s in seeds)


def _speed_cells(speed: dict | None) -> list[str]:
    """The tokens/s at each of SPEED_BATCHES of a run's SPEED (`–` without one)."""
    return [f"{speed[f'batch_{b}']['tokens_per_s']:.0f}" if speed else "–" for b in SPEED_BATCHES]


def table(result: dict) -> str:
    """The markdown table: each AR budget (PPL: the curve's seed mean of ln PPL, with the seeds' min–max), then
    each system (PPL: the seeds' mean, min–max) with its AR-equivalent minutes and multiplier (per seed where
    a seed is outside the ladder)."""
    lines = ["| system | seeds | PPL at real H | AR-equivalent minutes | multiplier | equal-minutes ratio | "
             "tok/s b1 | tok/s b64 |", "|---|---|---|---|---|---|---|---|"]
    ladder = [r for r in result["runs"] if r["role"] == "ladder"]
    curve = dict(zip(result["ar_curve"]["minutes"], result["ar_curve"]["ppl"]))
    for m in sorted({r["minutes"] for r in ladder}):
        rs = [r for r in ladder if r["minutes"] == m]
        speed = next((r["speed"] for r in rs if "speed" in r), None)
        ppl = spread([r["ppl_at_real_entropy"] for r in rs]) | {"mean": curve.get(m)}      # the curve's mean of ln
        lines.append(f"| AR {m:g} min | {len(rs)} | {_cell(ppl)} | {m:g} | – | – | "
                     f"{' | '.join(_speed_cells(speed))} |")
    for name, s in result["systems"].items():
        seeds = s["per_seed"]
        mult = [{"m": x["multiplier"]["value"], "b": x["multiplier"]["bound"]} for x in seeds]
        exact = all(x["ar_equivalent_minutes"] is not None for x in seeds)
        eq = _cell(s["ar_equivalent_minutes"], 2) if exact else _seed_cell(seeds, "ar_equivalent_minutes",
                                                                             "ar_equivalent_bound", 2)
        mu = _cell(s["multiplier"], 2) if exact else _seed_cell(mult, "m", "b", 2)
        lines.append(f"| {name} | {s['seeds']} | {_cell(s['ppl_at_real_entropy'])} | {eq} | {mu} | "
                     f"{_cell(s['equal_minutes_ratio'], 2)} | {' | '.join(_speed_cells(s['speed']))} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# the figure


def plot(result: dict, path: Path) -> None:
    """Two panels: the frontiers of every system and AR budget (judge PPL, log, against character entropy;
    the real text as a star), and the AR curve (PPL at the real entropy against minutes, log–log, seeds as
    points, the mean as a line) with each system as a band (seed min–max) at its PPL, its AR-equivalent
    minutes marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tdiff.files.streams import atomic_path

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), dpi=120)
    colors = _frontier_panel(left, result, plt)
    _curve_panel(right, result, colors)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".").lower() or "png")
    plt.close(fig)


def _frontier_panel(ax, result: dict, plt) -> dict:
    """The frontiers on AX; the colour of each system name (AR budgets in shades of grey)."""
    from tdiff.evaluation.plots import frontier_axes

    budgets = sorted({r["minutes"] for r in result["runs"] if r["role"] == "ladder"})
    greys = plt.get_cmap("Greys")
    colors = {f"AR {m:g} min": greys(0.35 + 0.6 * i / max(1, len(budgets) - 1)) for i, m in enumerate(budgets)}
    systems = [n for n in dict.fromkeys(r["system"] for r in result["runs"]) if n not in colors]
    colors.update({n: f"C{i % 10}" for i, n in enumerate(systems)})
    seen = set()
    for run in result["runs"]:
        pts = sorted(run["points"], key=lambda p: p["char_entropy"])
        ax.plot([p["char_entropy"] for p in pts], [p["judge_ppl"] for p in pts], "o--" if run["role"] == "ladder"
                else "o-", color=colors[run["system"]], ms=3, alpha=0.85,
                label=None if run["system"] in seen else run["system"])
        seen.add(run["system"])
    frontier_axes(ax, result["real"], "frontiers (tdiff: decoder knob; AR: temperature)")
    ax.legend(fontsize=7)
    return colors


def _mark_seed(ax, seed: dict, curve: dict, color) -> None:
    """A system SEED's AR-equivalent minutes on AX (▼ with the multiplier), or, outside the ladder, its
    bound at the ladder's end (◁ below the smallest budget, ▷ above the largest)."""
    ppl, minutes, bound = seed["ppl_at_real_entropy"], seed["ar_equivalent_minutes"], seed["ar_equivalent_bound"]
    if minutes is not None:
        ax.plot([minutes], [ppl], "v", color=color, ms=8)
        text, at = f"{minutes:.2g} min, ×{seed['multiplier']['value']:.2g}", minutes
    elif bound is not None:
        at = curve["minutes"][0] if bound.startswith("<") else curve["minutes"][-1]
        ax.plot([at], [ppl], "<" if bound.startswith("<") else ">", color=color, ms=8, mfc="none")
        text = f"{bound} min, multiplier {seed['multiplier']['bound']}"
    else:
        return
    ax.annotate(text, (at, ppl), fontsize=7, color=color, textcoords="offset points", xytext=(4, 4))


def _curve_panel(ax, result: dict, colors: dict) -> None:
    """The AR curve on AX, each system as a band at its PPL with its AR-equivalent minutes marked."""
    from matplotlib.ticker import NullLocator

    curve = result["ar_curve"]
    ax.set_xscale("log")
    ax.set_yscale("log")
    for i, (ladder, pts) in enumerate(curve["per_seed"].items()):
        pts = [p for p in pts if p[1] is not None]
        ax.plot([m for m, _ in pts], [p for _, p in pts], "os^vDx"[i % 6], color="k", ms=4, alpha=0.6,
                label=f"AR seed {Path(ladder).name}")
    if curve["minutes"]:
        ax.plot(curve["minutes"], curve["ppl"], "-", color="k", lw=1.5, label="AR, seed mean")
        ax.set_xticks(curve["minutes"], [f"{m:g}" for m in curve["minutes"]])
        ax.xaxis.set_minor_locator(NullLocator())
    for name, s in result["systems"].items():
        ppl, c = s["ppl_at_real_entropy"], colors.get(name, "C0")
        if ppl["mean"] is None:
            continue
        ax.axhspan(ppl["min"], ppl["max"], color=c, alpha=0.2, lw=0)
        ax.axhline(ppl["mean"], color=c, lw=1, label=f"{name} ({s['train_minutes']:g} min)")
        for seed in s["per_seed"]:
            _mark_seed(ax, seed, curve, c)
    ax.set_xlabel("AR training minutes")
    ax.set_ylabel("judge perplexity at the real entropy")
    ax.set_title("AR-equivalent minutes (▼: where the AR curve reaches each system seed)", fontsize=9)
    ax.legend(fontsize=7)


# ---------------------------------------------------------------------------
# sampling, speed, merging


def ladder_budgets(ladder: Path) -> list[tuple[float, Path]]:
    """(minutes, AR directory) of every finished budget LADDER/ar_<M>min/ar (ar_ladder.sh's layout), by minutes."""
    from tdiff.formats.ar_dir import is_ar_dir

    found = sorted((float(m.group(1)), d / "ar") for d in ladder.glob("ar_*min")
                   if (m := BUDGET_DIR.fullmatch(d.name)) and is_ar_dir(d / "ar"))
    if not found:
        sys.exit(f"ar_minutes: --ladder {ladder}: no finished budget ar_<M>min/ar in it (bench/quality/ar_ladder.sh)")
    return found


def speed(run: dict, cache: dict, repeats: int, seed: int, ar_length: int) -> dict:
    """Tokens/s of sampling the system of RUN (loaded in CACHE; tdiff with the run's steps and solver) at each
    of SPEED_BATCHES, with the timer of `tdiff eval --speed`, in bf16 where the CPU multiplies it natively,
    else fp32. AR models generate AR_LENGTH new tokens (0: 128 or what fits)."""
    from tdiff.core.device import resolve_device, resolve_dtype
    from tdiff.evaluation.speed import speed_ar, speed_diffusion
    from tdiff.formats.ar_dir import is_ar_dir

    path = Path(run["path"])
    device = resolve_device("cpu")
    dtype = resolve_dtype("auto", device)
    out = {"dtype": dtype}
    for b in SPEED_BATCHES:
        if is_ar_dir(path):
            model, tok = cache[path]
            length = min(ar_length, model.config.n_positions - 1)
            out[f"batch_{b}"] = speed_ar(model, tok, device, length=length, batch_size=b, repeats=repeats, seed=seed,
                                         dtype=dtype)
        else:
            out[f"batch_{b}"] = speed_diffusion(cache[path], device, steps=run["steps"], solver=run["solver"],
                                                batch_size=b, repeats=repeats, seed=seed, dtype=dtype)
        log(f"speed {path} batch {b}: {out[f'batch_{b}']['tokens_per_s']:.0f} tok/s ({dtype})")
    return out


def add_speeds(runs: list[dict], cache: dict, repeats: int, seed: int) -> None:
    """--speed: the speed of each system's first seed and of the largest AR budget (first ladder), into
    their runs. AR models generate as many tokens as the first tdiff model's fixed length."""
    firsts = {}
    for r in runs:
        if r["role"] == "system":
            firsts.setdefault(r["system"], r)
    ladder = [r for r in runs if r["role"] == "ladder"]
    chosen = list(firsts.values()) + ([max(ladder, key=lambda r: r["minutes"])] if ladder else [])
    tdiff = [r for r in firsts.values() if r["kind"] == "tdiff"]
    length = cache[Path(tdiff[0]["path"])].vae.config.max_len if tdiff else 0
    for run in chosen:
        run["speed"] = speed(run, cache, repeats, seed, length)


def sample(args: argparse.Namespace) -> dict:
    """Score every ladder budget and system of ARGS with the judge: the result before `analyse`."""
    set_threads(args.threads)
    judge = Judge(args.judge, args.dtype)
    real, shuffled = references(judge, args.real, args.num, args.seed)
    result = {"judge": str(args.judge), "real_path": str(args.real), "num": args.num, "seed": args.seed,
              "steps": args.steps, "solver": args.solver, "tdiff_knob": args.tdiff_knob, "dtype": args.dtype,
              "time_grid": args.time_grid, "round_x0": args.round_x0, "tdiff_decoder": args.tdiff_decoder,
              "minutes": args.minutes,
              "real": real, "shuffled": shuffled}
    runs, cache, examples = [], {}, {}
    for ladder in args.ladder:
        for m, path in ladder_budgets(ladder):
            run = score_system(f"AR {m:g} min", path, "", args, judge, cache, real, shuffled, examples)
            runs.append({**run, "role": "ladder", "ladder": str(ladder), "minutes": m})
    for spec in args.system:
        name, _, p = spec.partition("=")
        p, _, own = p.partition("@")
        if not name or not p:
            sys.exit(f"ar_minutes: --system {spec!r}: expected NAME=PATH")
        if not Path(p).exists():
            sys.exit(f"ar_minutes: --system {spec}: {p} does not exist")
        run = score_system(name, Path(p), own, args, judge, cache, real, shuffled, examples)
        runs.append({**run, "role": "system", "train_minutes": args.minutes})
    if args.speed:
        add_speeds(runs, cache, args.speed_repeats, args.seed)
    return {**result, "runs": runs, "examples": examples}


def merge(paths: list[Path]) -> dict:
    """The results of several runs of this benchmark (scored with the same judge and real text) as one,
    before `analyse`; a run given twice (same role, system and path) is kept once."""
    results = []
    for p in paths:
        try:
            r = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            sys.exit(f"ar_minutes: {p}: cannot read it as JSON ({e})")
        if not isinstance(r, dict) or not {"real", "runs"} <= r.keys() or any("role" not in x for x in r["runs"]):
            sys.exit(f"ar_minutes: {p}: not a result of bench.quality.ar_minutes (needs \"real\" and \"runs\")")
        if results and abs(r["real"]["judge_ppl"] - results[0]["real"]["judge_ppl"]) > 1e-6:
            sys.exit(f"ar_minutes: {p}: scored with another judge or real text than {paths[0]}")
        results.append(r)
    runs, keys, examples = [], set(), {}
    for r in results:
        examples.update(r.get("examples", {}))
        for run in r["runs"]:
            key = (run["role"], run["system"], run["path"])
            if key in keys:
                log(f"{run['system']} {run['path']} given twice: the first kept")
                continue
            keys.add(key)
            runs.append(run)
    return {**results[0], "merged": [str(p) for p in paths], "runs": runs, "examples": examples}


def parse_args() -> argparse.Namespace:
    """The options; --judge, --real and a --ladder or --system unless --merge; --minutes 20 when sampling."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--merge", nargs="+", type=Path, help="re-tabulate saved results (no sampling)")
    ap.add_argument("--judge", type=Path)
    ap.add_argument("--real", type=Path, help="held-out text JSONL ({'text': ...})")
    ap.add_argument("--ladder", action="append", default=[], type=Path,
                    help="an ar_ladder.sh OUT_DIR (repeat: seeds)")
    ap.add_argument("--system", action="append", default=[],
                    help="NAME=PATH[@STEPS[:SOLVER]] (repeat; same NAME = seeds)")
    ap.add_argument("--minutes", type=float, help="the systems' own training minutes (default 20; with --merge: "
                                                   "as saved)")
    add_sampling_args(ap)
    ap.add_argument("--speed", action="store_true", help="tokens/s at batch 1 and 64 (systems' first seeds, "
                                                         "largest AR budget)")
    ap.add_argument("--speed-repeats", type=int, default=3)
    ap.add_argument("--plot", type=Path)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if not args.merge:
        if args.judge is None or args.real is None or not (args.ladder or args.system):
            ap.error("give --judge, --real and at least one --ladder or --system (or --merge FILES)")
        args.minutes = 20.0 if args.minutes is None else args.minutes
    if args.minutes is not None and args.minutes <= 0:
        ap.error(f"--minutes {args.minutes:g}: must be positive")
    return args


def main() -> None:
    args = parse_args()
    result = analyse(merge(args.merge) if args.merge else sample(args), args.minutes)
    if args.plot:
        plot(result, args.plot)
        log(f"wrote {args.plot}")
    print(result["table"], file=sys.stderr)
    print_json(result, indent=1)


if __name__ == "__main__":
    main()
