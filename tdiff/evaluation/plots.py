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

from tdiff.core.errors import DataError, NoInputError, UsageError

PANELS = (("loss", "loss"), ("lr", "learning rate"), ("tokens_per_s", "tokens / s"), ("grad_norm", "gradient norm"))
X_AXES = ("step", "time")
NUMBER_FIELDS = tuple(f for f, _ in PANELS) + ("elapsed_s",)   # and heldout*: numbers where present
MAGNITUDE = (1e-100, 1e100)                                    # of a number a figure can place (or 0)
_NUMBER, _POSITIVE = "a number (0 or 1e-100 to 1e100 in size)", "a positive number (1e-100 to 1e100)"
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
    from tdiff.files.streams import atomic_path

    fmt = Path(path).suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise UsageError(f"-o {path}: the suffix names the format: {', '.join('.' + f for f in FORMATS)}")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt)


def _plottable(v) -> bool:
    """V is a JSON number (not a boolean) that a figure can place: 0 or of magnitude within MAGNITUDE
    (matplotlib's scales overflow on the extremes of a float's range: 1e308, denormals)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return v == 0 or MAGNITUDE[0] <= abs(float(v)) <= MAGNITUDE[1]
    except OverflowError:                                  # an integer of hundreds of digits
        return False


def _show(v) -> str:
    """V as the message shows it: its JSON text, cut short."""
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _log_problem(rec: dict) -> str | None:
    """What is wrong with metrics record REC, or None: an integer "step" and a number "loss", and every
    other field the figure reads (NUMBER_FIELDS, heldout*) a number where present (all `_plottable`)."""
    for field in ("step", "loss"):
        if field not in rec:
            return f"no \"{field}\" field (a metrics record needs an integer \"step\" and a number \"loss\"; " \
                   "written by a training command's --log)"
    step = rec["step"]
    if not _plottable(step) or not isinstance(step, int):
        return f"field \"step\" must be an integer (at most 1e100 in size), not {_show(step)}"
    for field, v in rec.items():
        if (field in NUMBER_FIELDS or field.startswith("heldout")) and not _plottable(v):
            return f"field \"{field}\" must be {_NUMBER}, not {_show(v)}"
    return None


def read_log(path) -> list[dict]:
    """The records of a metrics log (DataError naming FILE:LINE and the field of a bad one; at least one
    record)."""
    from tdiff.files.streams import display_name, iter_jsonl

    recs = []
    for n, rec in iter_jsonl(path):
        problem = _log_problem(rec)
        if problem:
            raise DataError(f"{display_name(path)}:{n}: {problem}")
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
            pts = [(xv, r[field]) for xv, r in zip(xs_all, recs) if xv is not None and field in r]
            if pts:
                ax.plot(*zip(*pts), "-", color=c, lw=1.2, label=name)
            if field == "loss":
                held = sorted({k for r in recs for k in r if k.startswith("heldout")})
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
    """OBJ is meant as a frontier result (a JSON object with "runs" or "real"); `check_frontier` says
    whether it is a good one."""
    return isinstance(obj, dict) and ("runs" in obj or "real" in obj)


_KINDS = {"an object": lambda v: isinstance(v, dict), "a list": lambda v: isinstance(v, list),
          "text": lambda v: isinstance(v, str), "text or null": lambda v: v is None or isinstance(v, str),
          _NUMBER: _plottable, _POSITIVE: lambda v: _plottable(v) and v > 0}


def _field(obj: dict, key: str, kind: str, name: str, where: str = ""):
    """OBJ[KEY], checked to be KIND (one of _KINDS); a DataError naming file NAME and the field's path."""
    path = f"{where}.{key}" if where else key
    if key not in obj:
        raise DataError(f"{name}: field \"{path}\" is missing (not a frontier result of bench/frontier.py)")
    return _item(obj[key], kind, name, path)


def _item(v, kind: str, name: str, path: str):
    """V (at PATH of file NAME), checked to be KIND."""
    if not _KINDS[kind](v):
        raise DataError(f"{name}: field \"{path}\" must be {kind}, not {_show(v)}")
    return v


def check_frontier(result, name: str) -> dict:
    """RESULT, checked to be a frontier result (bench/frontier.py's JSON) in every field the figure
    reads: real.{judge_ppl > 0, char_entropy}, runs[i].{system, points[j].{knob, judge_ppl > 0,
    char_entropy}}, an optional title. DataError naming NAME and the field otherwise."""
    if not isinstance(result, dict):
        raise DataError(f"{name}: not a frontier result (bench/frontier.py's JSON object), but {_show(result)}")
    real = _field(result, "real", "an object", name)
    _field(real, "judge_ppl", _POSITIVE, name, "real")
    _field(real, "char_entropy", _NUMBER, name, "real")
    if "title" in result:
        _field(result, "title", "text or null", name)
    for i, run in enumerate(_field(result, "runs", "a list", name)):
        where = f"runs[{i}]"
        _item(run, "an object", name, where)
        _field(run, "system", "text", name, where)
        for j, point in enumerate(_field(run, "points", "a list", name, where)):
            at = f"{where}.points[{j}]"
            _item(point, "an object", name, at)
            _field(point, "knob", _NUMBER, name, at)
            _field(point, "judge_ppl", _POSITIVE, name, at)
            _field(point, "char_entropy", _NUMBER, name, at)
    return result


def frontier(result: dict, path: Path) -> None:
    """Judge perplexity against character entropy: one line per system (runs of the same name, e.g.
    seeds, share a colour), each point labelled with its decoding knob; the real text as a star."""
    check_frontier(result, "the frontier result")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    colors = {}
    for run in result["runs"]:
        first = run["system"] not in colors
        c = colors.setdefault(run["system"], f"C{len(colors) % 10}")
        pts = sorted(run["points"], key=lambda p: p["char_entropy"])
        ax.plot([p["char_entropy"] for p in pts], [p["judge_ppl"] for p in pts], "o-", color=c, alpha=0.8,
                label=run["system"] if first else None)
        for p in pts:
            ax.annotate(f"{p['knob']:g}", (p["char_entropy"], p["judge_ppl"]), fontsize=6, color=c,
                        textcoords="offset points", xytext=(3, 3))
    frontier_axes(ax, result["real"], result.get("title") or
                  "quality–diversity frontier (tdiff: decoder top-p; AR: temperature)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def frontier_axes(ax, real: dict, title: str) -> None:
    """A frontier panel's frame: the REAL text ({"char_entropy", "judge_ppl"}) as a star on a dashed
    vertical line, log judge perplexity against character entropy, TITLE."""
    ax.axvline(real["char_entropy"], color="grey", ls="--", lw=0.8)
    ax.plot([real["char_entropy"]], [real["judge_ppl"]], "k*", ms=10, label="real held-out")
    ax.set_yscale("log")
    ax.set_xlabel("character unigram entropy (nats)  [higher = more diverse]")
    ax.set_ylabel("judge perplexity  [lower = reads better]")
    ax.set_title(title, fontsize=9)


def merge_frontiers(results: list[dict], names: list[str]) -> dict:
    """Several frontier results scored with the same judge and real text as one (a system's seeds,
    NAME_sK, share its name). DataError naming the file for a bad result or when the judges differ."""
    for n, r in zip(names, results):
        check_frontier(r, n)
    base = results[0]
    for n, r in zip(names, results):
        if abs(r["real"]["judge_ppl"] - base["real"]["judge_ppl"]) > 1e-6:
            raise DataError(f"{n}: scored with another judge or real text than {names[0]}")
    runs = [{**run, "system": run["system"].rsplit("_s", 1)[0]} for r in results for run in r["runs"]]
    return {**base, "runs": runs}


def _read_json(p: Path):
    """The JSON value of file P (None when it is not one JSON document: then it may be a metrics log)."""
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, RecursionError):                   # not JSON, not UTF-8, nested too deeply
        return None


def _check_exists(p: Path) -> None:
    """NoInputError (exit 66) when input P is missing or a directory; '-' (stdin) is fine."""
    from tdiff.files.streams import is_std

    if is_std(str(p)):
        return
    if not p.exists():
        raise NoInputError(f"'{p}' does not exist")
    if p.is_dir():
        raise NoInputError(f"'{p}' is a directory, not a metrics log or frontier file")


def load_inputs(paths) -> tuple[str, list]:
    """("curves", [(name, records)]) for metrics logs or ("frontier", [results]) for frontier JSON
    files (each checked: a DataError naming the file and field); a usage error for a mixture."""
    entries = []
    for p in map(Path, paths):
        _check_exists(p)
        obj = _read_json(p) if p.suffix == ".json" else None
        entries.append((p, obj if is_frontier(obj) else None))
    kinds = {"curves" if obj is None else "frontier" for _, obj in entries}
    if len(kinds) > 1:
        raise UsageError("give metrics logs or frontier files, not both in one figure")
    if kinds == {"frontier"}:
        return "frontier", [check_frontier(obj, str(p)) for p, obj in entries]
    return "curves", [(p.stem, read_log(p)) for p, _ in entries]
