#!/usr/bin/env bash
# Every benchmark in bench/, one after the other; each prints JSON. The results are kept in
# $BENCH_OUT/<name>.json and printed together as one JSON object on stdout.
# SHARED (default ../shared) locates the corpora; BENCHES picks a subset, e.g. BENCHES="speed_vs_ar".
set -euo pipefail
cd "$(dirname "$0")/.."
export SHARED=${SHARED:-../shared}
BENCH_OUT=${BENCH_OUT:-bench_out}
BENCHES=${BENCHES:-"clean_throughput tokenize_throughput speed_vs_ar profile_sample quality"}
mkdir -p "$BENCH_OUT"
for b in $BENCHES; do
  echo "== bench/$b.py ==" >&2
  start=$SECONDS
  python "bench/$b.py" > "$BENCH_OUT/$b.json.tmp"
  mv "$BENCH_OUT/$b.json.tmp" "$BENCH_OUT/$b.json"
  echo "   ($b: $((SECONDS - start)) s)" >&2
done
python - "$BENCH_OUT" $BENCHES <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
print(json.dumps({n: json.load(open(f"{out}/{n}.json", encoding="utf-8")) for n in names},
                 ensure_ascii=False, indent=1))
PY
