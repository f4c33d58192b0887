"""One markdown row per run directory of bench/recipe.sh that has been scored: training steps,
held-out loss, the per-noise-level gain of `tdiff eval --data` (best in t ∈ [0.6, 0.9]), and the
frontier of bench/frontier.py (judge PPL and q at the real text's entropy, the greedy point).

Usage: python bench/ablation_table.py RUN_DIR...   (each with eval.json and frontier.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(run: Path) -> str:
    def load(name):
        p = run / name
        return json.loads(p.read_text()) if p.exists() else None

    dit = json.loads((run / "train.log").read_text().split("summary ", 1)[1].splitlines()[0]) if (run / "train.log").exists() else {}
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


def main() -> None:
    print("| run | DiT steps | held-out loss | best gain t∈[0.6,0.9] | greedy PPL / entropy | PPL @ real H | q @ real H |")
    print("|---|---|---|---|---|---|---|")
    for d in sys.argv[1:]:
        print(row(Path(d)))


if __name__ == "__main__":
    main()
