#!/usr/bin/env bash
# The AR baseline trained at several time budgets, for the AR-equivalent-minutes figure
# (python -m bench.quality.ar_minutes; docs/RESULTS.md, the quality headline). Each budget is
# its own run from scratch with the learning rate decayed over that budget (--lr-decay budget),
# pinned as bench/quality/recipe.sh pins it.
#
#   bash bench/quality/ar_ladder.sh OUT_DIR SEED        → OUT_DIR/ar_<M>min/ar for M in $MINUTES
#
# Environment: MINUTES ("1 2 4 8 20"), SIZE ("4 224 4": layers, width, heads — the tdiff default
# recipe's parameter count, as `python -m bench.quality.ar_size MODEL` prints it), DATA, CPUS,
# THREADS, DTYPE as recipe.sh. A budget whose ar/config.json exists is skipped.
set -euo pipefail
OUT=${1:?out dir}; SEED=${2:?seed}
DATA=${DATA:-bench_out/songci}
MINUTES=${MINUTES:-1 2 4 8 20}
read -r NL NE NH <<< "${SIZE:-4 224 4}"
DTYPE=${DTYPE:-bf16}
PIN=()
[ -n "${CPUS:-}" ] && PIN=(taskset -c "$CPUS")
[ -n "${THREADS:-}" ] && export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
for M in $MINUTES; do
  RUN="$OUT/ar_${M}min"
  [ -s "$RUN/ar/config.json" ] && continue
  mkdir -p "$RUN"
  t0=$SECONDS
  "${PIN[@]}" tdiff train-ar -i "$DATA/ids.jsonl" -t "$DATA/tok.model" -o "$RUN/ar" \
    --n-layers "$NL" --d-model "$NE" --n-heads "$NH" --max-minutes "$M" --max-steps 1000000 \
    --lr-decay budget --dtype "$DTYPE" --device cpu --seed "$SEED" --log-every 100 \
    --log "$RUN/ar_metrics.jsonl" 2> "$RUN/train-ar.log"
  echo "{\"stage\": \"train-ar\", \"minutes\": $M, \"seconds\": $((SECONDS - t0)), \"cpus\": \"${CPUS:-all}\", \"threads\": \"${THREADS:-default}\"}" >> "$RUN/stage_times.jsonl"
done
echo "ar_ladder.sh: $OUT done" >&2
