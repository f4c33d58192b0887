"""Throughput and peak memory of `tdiff clean`; prints one JSON object on stdout.

- library: MB/s of input through tdiff.text.clean.Cleaner in the default line
  mode (decode, clean, JSONL-encode; nothing written), per corpus;
- cli: MB/s of `python -m tdiff clean -i FILE` (wall clock including start-up,
  and the rate the command reports on stderr);
- peak RSS (ru_maxrss of the child, via RUSAGE_CHILDREN) of `python -m tdiff
  clean` on a ~50 MB input (tangshi.txt four times, written to a temp dir),
  default options and with --dedup.

Corpora come from $SHARED/data (default: ../shared relative to the repo root).
Targets: >= 5 MB/s on songci/tangshi, peak RSS < 300 MB.
Usage: python -m bench.throughput.clean_throughput
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

from bench.common import corpus_dir, print_json, run_tdiff
from tdiff.files.streams import DecodeStats, dumps, iter_lines
from tdiff.text.clean import Cleaner

CORPORA = ["songci.txt", "tangshi.txt", "tinyshakespeare.txt"]
TARGET_MB_S = 5.0
TARGET_RSS_MB = 300.0


def _mb(path: Path) -> float:
    return path.stat().st_size / 1e6


def library_mb_s(path: Path, repeats: int = 2) -> float:
    """Best of REPEATS: MB/s of PATH through the library's line mode."""
    best = 0.0
    for _ in range(repeats):
        cleaner = Cleaner()
        t = time.perf_counter()
        n = 0
        for _, line in iter_lines(path, stats=DecodeStats()):
            for piece in cleaner.clean(line):
                n += len(dumps({"text": piece}))
        best = max(best, _mb(path) / (time.perf_counter() - t))
    return best


def _run_cli(args: list[str]) -> tuple[float, str]:
    """Run `python -m tdiff clean ARGS` (stdout discarded); (wall seconds, stderr)."""
    wall, _, err = run_tdiff(["clean", *args])
    return wall, err


def cli_mb_s(path: Path) -> dict:
    wall, err = _run_cli(["-i", str(path)])
    m = re.search(r"\(([\d.]+) MB/s\)", err)
    return {
        "wall_mb_s": round(_mb(path) / wall, 2),
        "reported_mb_s": float(m.group(1)) if m else None,
        "wall_s": round(wall, 3),
    }


def _child_maxrss_mb() -> float:
    """Largest resident set of any waited-for child so far, in MB."""
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return rss / 1e6 if sys.platform == "darwin" else rss / 1024


def peak_rss(big: Path) -> dict:
    """Peak RSS of `tdiff clean` on BIG, default options then --dedup.

    RUSAGE_CHILDREN is a running maximum, so the default run goes first: its
    figure is exact, the --dedup figure is the larger of the two."""
    out = {"input_mb": round(_mb(big), 1)}
    wall, _ = _run_cli(["-i", str(big), "--quiet"])
    out["default_mb"] = round(_child_maxrss_mb(), 1)
    out["default_mb_s"] = round(_mb(big) / wall, 2)
    wall, _ = _run_cli(["-i", str(big), "--quiet", "--dedup"])
    out["dedup_mb"] = round(_child_maxrss_mb(), 1)
    out["dedup_mb_s"] = round(_mb(big) / wall, 2)
    return out


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    data = corpus_dir()
    corpora = [data / name for name in CORPORA if (data / name).exists()]
    if not corpora:
        raise SystemExit(f"no corpora in {data} (set SHARED=/path/to/shared)")
    result: dict = {"bench": "clean_throughput", "python": sys.version.split()[0], "cpus": os.cpu_count()}

    tangshi = data / "tangshi.txt"
    if tangshi.exists():
        with tempfile.TemporaryDirectory() as tmp:
            big = Path(tmp) / "tangshi_x4.txt"
            data = tangshi.read_bytes()
            with open(big, "wb") as f:
                for _ in range(4):
                    f.write(data)
            del data
            result["peak_rss"] = peak_rss(big)

    result["library_mb_s"] = {p.name: round(library_mb_s(p), 2) for p in corpora}
    result["cli"] = {p.name: cli_mb_s(p) for p in corpora}

    chinese = [n for n in ("songci.txt", "tangshi.txt") if n in result["library_mb_s"]]
    # the rate the command reports: its processing throughput, without interpreter start-up
    speed_ok = all((result["cli"][n]["reported_mb_s"] or 0) >= TARGET_MB_S for n in chinese)
    rss_ok = "peak_rss" not in result or result["peak_rss"]["default_mb"] < TARGET_RSS_MB
    result["targets"] = {"mb_s": TARGET_MB_S, "peak_rss_mb": TARGET_RSS_MB, "met": bool(speed_ok and rss_ok)}
    print_json(result)


if __name__ == "__main__":
    main()
