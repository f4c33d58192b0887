#!/usr/bin/env bash
# The default benchmarks of bench/, one after the other, each run as a module (`python -m bench.GROUP.NAME`)
# from the repository root; each prints JSON. The results are kept in $BENCH_OUT/NAME.json and printed
# together as one JSON object {NAME: result} on stdout.
# SHARED (default ../shared) locates the corpora; BENCHES picks a subset by GROUP.NAME,
# e.g. BENCHES="speed.speed_vs_ar". The index of every benchmark is bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export SHARED=${SHARED:-../shared}
BENCH_OUT=${BENCH_OUT:-bench_out}
BENCHES=${BENCHES:-"throughput.clean_throughput throughput.tokenize_throughput speed.speed_vs_ar speed.profile_sample quality.quality"}
mkdir -p "$BENCH_OUT"
names=()
for b in $BENCHES; do
  [ -f "bench/${b//.//}.py" ] || { echo "run_all.sh: no benchmark bench.$b (BENCHES takes GROUP.NAME; see bench/README.md)" >&2; exit 64; }
  n=${b##*.}
  names+=("$n")
  echo "== python -m bench.$b ==" >&2
  start=$SECONDS
  python -m "bench.$b" > "$BENCH_OUT/$n.json.tmp"
  mv "$BENCH_OUT/$n.json.tmp" "$BENCH_OUT/$n.json"
  echo "   ($n: $((SECONDS - start)) s)" >&2
done
python - "$BENCH_OUT" "${names[@]}" <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
print(json.dumps({n: json.load(open(f"{out}/{n}.json", encoding="utf-8")) for n in names},
                 ensure_ascii=False, indent=1))
PY
