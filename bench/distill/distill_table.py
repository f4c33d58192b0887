"""The distillation table: teacher and students compared at one matched entropy.

Reads the frontier.json files of bench/distill/distill_bench.sh (one per seed) and reads every run's judge
perplexity off its frontier at one common character entropy H (ln-linear between the two sweep points
that bracket H, as bench.quality.frontier does at the real entropy). Students are sharper than their
teacher (their sweeps end below the real text's entropy), so H is by default the highest entropy that
every run's sweep reaches, and q is given there too; each run's PPL and entropy at knob 1 (plain
sampling of the decoder) are listed beside it. Prints JSON, and a markdown table on stderr.

Usage: python -m bench.distill.distill_table bench_out/dist/s0/frontier.json bench_out/dist/s1/frontier.json [--entropy H]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.common import print_json
from bench.quality.frontier import at_entropy, spread


def main() -> None:
    from tdiff.evaluation.metrics import q_position

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("frontiers", nargs="+", type=Path)
    ap.add_argument("--entropy", type=float, default=0.0, help="the matched entropy (default: the highest all runs reach)")
    a = ap.parse_args()
    results = [json.loads(p.read_text()) for p in a.frontiers]
    runs = [(r, run) for r in results for run in r["runs"]]
    h = a.entropy or min(max(p["char_entropy"] for p in run["points"]) for _, run in runs)
    h = min(h, min(max(p["char_entropy"] for p in run["points"]) for _, run in runs))
    rows = {}
    for r, run in runs:
        ppl = at_entropy(run["points"], h)
        q = None if ppl is None else q_position(ppl, r["real"]["judge_ppl"], r["shuffled"]["judge_ppl"])
        k1 = next((p for p in run["points"] if p["knob"] == 1.0), None)
        rows.setdefault(run["system"], []).append(
            {"ppl": ppl, "q": q, "knob1_ppl": k1 and k1["judge_ppl"], "knob1_entropy": k1 and k1["char_entropy"],
             "steps": run.get("steps"), "solver": run.get("solver")})
    out = {"entropy": round(h, 4), "real_entropy": [r["real"]["char_entropy"] for r in results],
           "real_ppl": [r["real"]["judge_ppl"] for r in results], "systems": {}}
    lines = [f"| system | steps, solver | judge PPL at H = {h:.3f} | q at H | knob 1: PPL / entropy |", "|---|---|---|---|---|"]
    for name, rs in rows.items():
        s = {"ppl_at_h": spread([x["ppl"] for x in rs]), "q_at_h": spread([x["q"] for x in rs]),
             "knob1_ppl": spread([x["knob1_ppl"] for x in rs]), "knob1_entropy": spread([x["knob1_entropy"] for x in rs]),
             "steps": rs[0]["steps"], "solver": rs[0]["solver"], "seeds": len(rs)}
        out["systems"][name] = s
        f = lambda d, n=1: "–" if d["mean"] is None else f"{d['mean']:.{n}f} ({d['min']:.{n}f}–{d['max']:.{n}f})"
        lines.append(f"| {name} | {s['steps']} {s['solver']} | {f(s['ppl_at_h'])} | {f(s['q_at_h'], 3)} | "
                     f"{f(s['knob1_ppl'])} / {f(s['knob1_entropy'], 3)} |")
    print_json(out, indent=1)
    print("\n".join(lines), file=sys.stderr)


if __name__ == "__main__":
    main()
