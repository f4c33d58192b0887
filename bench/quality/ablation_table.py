"""One markdown row per run directory of bench/quality/recipe.sh that has been scored: training steps,
held-out loss, the per-noise-level gain of `tdiff eval --data` (best in t ∈ [0.6, 0.9]), and the
frontier of bench.quality.frontier (judge PPL and q at the real text's entropy, the greedy point).

Usage: python -m bench.quality.ablation_table RUN_DIR...   (each with eval.json and frontier.json)

After the per-run rows, a second table pools the seeds of each lever: runs named NAME and NAME_sK
(K a seed) are one lever; its PPL and q at the real entropy are given as mean (min–max). A run
still being scored (missing or half-written files) shows dashes.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def _summary(log: Path) -> dict:
    """The training summary line of LOG ({} while training still runs or when there is no log)."""
    try:
        text = log.read_text()
        return json.loads(text.split("summary ", 1)[1].splitlines()[0])
    except (OSError, IndexError, ValueError):
        return {}


def row(run: Path) -> str:
    def load(name):
        p = run / name
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None

    dit = _summary(run / "train.log")
    ev, fr = load("eval.json"), load("frontier.json")
    gains = {float(t): v["gain"] for t, v in ev["noise_levels"]["by_t"].items()} if ev else {}
    best = max((g, t) for t, g in gains.items() if 0.6 <= t <= 0.9) if gains else (None, None)
    r = fr["runs"][0] if fr else {}
    greedy = next((p for p in r.get("points", []) if p["knob"] == 0), None)
    fmt = lambda x, f: "–" if x is None else format(x, f)  # noqa: E731
    return (f"| {run.name} | {dit.get('steps', '–')} | {fmt(dit.get('heldout_loss'), '.3f')} | "
            f"{fmt(best[0], '+.3f')} @ {fmt(best[1], 'g')} | "
            f"{fmt(greedy and greedy['judge_ppl'], '.0f')} / {fmt(greedy and greedy['char_entropy'], '.3f')} | "
            f"{fmt(r.get('ppl_at_real_entropy'), '.0f')} | {fmt(r.get('q_at_real_entropy'), '.3f')} |")


def lever(name: str) -> str:
    """A run's lever: its name without a trailing _sK seed suffix."""
    return re.sub(r"_s\d+$", "", name)


def pooled(runs: list[Path]) -> list[str]:
    """One row per lever: seeds, PPL and q at the real entropy as mean (min–max)."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        try:
            r = json.loads((run / "frontier.json").read_text())["runs"][0]
        except (OSError, ValueError, KeyError, IndexError):
            continue
        if r.get("ppl_at_real_entropy") is not None:
            groups.setdefault(lever(run.name), []).append(r)
    out = ["| lever | seeds | PPL @ real H, mean (min–max) | q @ real H, mean (min–max) |", "|---|---|---|---|"]
    for name, rs in groups.items():
        p = [r["ppl_at_real_entropy"] for r in rs]
        q = [r["q_at_real_entropy"] for r in rs]
        out.append(f"| {name} | {len(rs)} | {sum(p) / len(p):.0f} ({min(p):.0f}–{max(p):.0f}) | "
                   f"{sum(q) / len(q):.3f} ({min(q):.3f}–{max(q):.3f}) |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR", help="run directories (eval.json, frontier.json)")
    runs = ap.parse_args().runs
    print("| run | DiT steps | held-out loss | best gain t∈[0.6,0.9] | greedy PPL / entropy | PPL @ real H | q @ real H |")
    print("|---|---|---|---|---|---|---|")
    for d in runs:
        print(row(d))
    print()
    print("\n".join(pooled(runs)))


if __name__ == "__main__":
    main()
