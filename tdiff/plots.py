"""Figures of runs and benchmarks (`tdiff plot`), drawn with matplotlib (the optional extra `plot`).

- `training_curves`: the metrics logs of training commands (`--log`, one JSON record per logged
  step) overlaid, one panel per quantity: loss (and any held-out figure the log carries), learning
  rate, tokens/s and gradient norm, against the step or the training time.
- `frontier`: a quality–diversity frontier (bench/frontier.py's JSON): judge perplexity against
  character entropy, one line per system, the real held-out text as a star.

Files are written atomically (temp file, then rename); the format follows the suffix (.png, .pdf, .svg).
"""

from __future__ import annotations

import json
from pathlib import Path

from tdiff.errors import DataError, UsageError

PANELS = (("loss", "loss"), ("lr", "learning rate"), ("tokens_per_s", "tokens / s"), ("grad_norm", "gradient norm"))
X_AXES = ("step", "time")
FORMATS = ("png", "pdf", "svg")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("tdiff plot needs matplotlib: pip install 'tdiff[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    from tdiff.io import atomic_path

    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise UsageError(f"-o {path}: the suffix names the format: {', '.join('.' + f for f in FORMATS)}")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt)


def read_log(path) -> list[dict]:
    """The records of a metrics log (DataError naming FILE:LINE for a bad one; at least one record
    with a step and a loss)."""
    from tdiff.io import display_name, iter_jsonl

    recs = []
    for n, rec in iter_jsonl(path):
        if not isinstance(rec.get("step"), int) or not isinstance(rec.get("loss"), (int, float)):
            raise DataError(f"{display_name(path)}:{n}: not a metrics record (needs an integer \"step\" and a "
                            "number \"loss\"; written by a training command's --log)")
        recs.append(rec)
    if not recs:
        raise DataError(f"{display_name(path)}: no metrics records")
    return recs


def training_curves(runs: list[tuple[str, list[dict]]], path: Path, x: str = "step", title: str = "") -> None:
    """RUNS = [(name, records)] drawn in one figure of four panels (PANELS) against X (step | time)."""
    if x not in X_AXES:
        raise UsageError(f"--x {x!r}: choose one of {', '.join(X_AXES)}")
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), dpi=110)
    key = "step" if x == "step" else "elapsed_s"
    for i, (name, recs) in enumerate(runs):
        c = f"C{i % 10}"
        xs_all = [r.get(key) for r in recs]
        for ax, (field, label) in zip(axes.flat, PANELS):
            pts = [(xv, r[field]) for xv, r in zip(xs_all, recs)
                   if xv is not None and isinstance(r.get(field), (int, float))]
            if pts:
                ax.plot(*zip(*pts), "-", color=c, lw=1.2, label=name)
            if field == "loss":
                held = sorted({k for r in recs for k in r if k.startswith("heldout") and
                               isinstance(r[k], (int, float))})
                for k in held:
                    hp = [(xv, r[k]) for xv, r in zip(xs_all, recs) if xv is not None and k in r]
                    ax.plot(*zip(*hp), "o--", color=c, lw=1, ms=3, label=f"{name} {k}")
    for ax, (field, label) in zip(axes.flat, PANELS):
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("optimizer step" if x == "step" else "training time (s)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        lo, hi = ax.dataLim.intervaly
        if field in ("loss", "grad_norm") and ax.has_data() and lo > 0 and hi / lo > 20:
            ax.set_yscale("log")                           # losses that fall by orders of magnitude
    axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def is_frontier(obj) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("runs"), list) and isinstance(obj.get("real"), dict)


def frontier(result: dict, path: Path) -> None:
    """Judge perplexity against character entropy: one line per system (runs of the same name, e.g.
    seeds, share a colour), each point labelled with its decoding knob; the real text as a star."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    colors = {}
    try:
        for run in result["runs"]:
            first = run["system"] not in colors
            c = colors.setdefault(run["system"], f"C{len(colors) % 10}")
            pts = sorted(run["points"], key=lambda p: p["char_entropy"])
            ax.plot([p["char_entropy"] for p in pts], [p["judge_ppl"] for p in pts], "o-", color=c, alpha=0.8,
                    label=run["system"] if first else None)
            for p in pts:
                ax.annotate(f"{p['knob']:g}", (p["char_entropy"], p["judge_ppl"]), fontsize=6, color=c,
                            textcoords="offset points", xytext=(3, 3))
        real = result["real"]
        ax.axvline(real["char_entropy"], color="grey", ls="--", lw=0.8)
        ax.plot([real["char_entropy"]], [real["judge_ppl"]], "k*", ms=10, label="real held-out")
    except (KeyError, TypeError) as e:
        plt.close(fig)
        raise DataError(f"not a frontier result (bench/frontier.py's JSON): missing {e}") from None
    ax.set_yscale("log")
    ax.set_xlabel("character unigram entropy (nats)  [higher = more diverse]")
    ax.set_ylabel("judge perplexity  [lower = reads better]")
    ax.set_title(result.get("title") or "quality–diversity frontier (tdiff: decoder top-p; AR: temperature)",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def merge_frontiers(results: list[dict], names: list[str]) -> dict:
    """Several frontier results scored with the same judge and real text as one (a system's seeds,
    NAME_sK, share its name). DataError when the judges differ."""
    base = results[0]
    for n, r in zip(names, results):
        if abs(r["real"]["judge_ppl"] - base["real"]["judge_ppl"]) > 1e-6:
            raise DataError(f"{n}: scored with another judge or real text than {names[0]}")
    runs = [{**run, "system": run["system"].rsplit("_s", 1)[0]} for r in results for run in r["runs"]]
    return {**base, "runs": runs}


def load_inputs(paths) -> tuple[str, list]:
    """("curves", [(name, records)]) for metrics logs or ("frontier", [results]) for frontier JSON
    files; a usage error for a mixture."""
    kinds, items = set(), []
    for p in paths:
        p = Path(p)
        text = None
        if p.suffix == ".json":
            from tdiff.errors import NoInputError

            if not p.is_file():
                raise NoInputError(f"'{p}' does not exist")
            try:
                text = json.loads(p.read_text(encoding="utf-8"))
            except ValueError:
                text = None
        if is_frontier(text):
            kinds.add("frontier")
            items.append(text)
        else:
            kinds.add("curves")
            items.append((p.stem, read_log(p)))
    if len(kinds) > 1:
        raise UsageError("give metrics logs or frontier files, not both in one figure")
    return kinds.pop(), items
