#!/usr/bin/env bash
# Distil one songci teacher (bench/quality/recipe.sh's default model) with both methods, then score teacher and
# students on the quality–diversity frontier with the same judge. Usage:
#   bash bench/distill/distill_bench.sh TEACHER.safetensors OUT_DIR SEED   (IDS, JUDGE, REAL: the songci files)
# from the repository root (the frontier stage runs `python -m bench.quality.frontier`).
# Budget (both cores, nothing else running): progressive 64 → 4 in 6 min (1.5 min a round), 4 → 2 in 2 min,
# 2 → 1 in 2 min; consistency (ODE cut into 64 steps) 10 min. The teacher's own DiT had 10 min.
set -euo pipefail
T=$1; OUT=$2; SEED=$3
IDS=${IDS:-bench_out/songci/ids.jsonl}; JUDGE=${JUDGE:-bench_out/songci/judge}; REAL=${REAL:-bench_out/songci/held.jsonl}
mkdir -p "$OUT"
stage() {   # stage NAME command...: run it, append its wall time to stage_times.jsonl
  local name=$1; shift
  local t0=$(date +%s)
  "$@" 2> "$OUT/$name.log"
  echo "{\"stage\": \"$name\", \"seconds\": $(( $(date +%s) - t0 ))}" >> "$OUT/stage_times.jsonl"
}
common=(-i "$IDS" --seed "$SEED" --log-every 25 --ckpt-every 200)
stage prog4 python -m tdiff distill "${common[@]}" -m "$T" -o "$OUT/prog4.safetensors" --from-steps 64 --to-steps 4 \
  --max-minutes 6 --max-steps 100000 --lr-decay budget --log "$OUT/prog4.jsonl"
stage prog2 python -m tdiff distill "${common[@]}" -m "$OUT/prog4.safetensors" -o "$OUT/prog2.safetensors" \
  --from-steps 4 --to-steps 2 --max-minutes 2 --max-steps 100000 --lr-decay budget --log "$OUT/prog2.jsonl"
stage prog1 python -m tdiff distill "${common[@]}" -m "$OUT/prog2.safetensors" -o "$OUT/prog1.safetensors" \
  --from-steps 2 --to-steps 1 --max-minutes 2 --max-steps 100000 --lr-decay budget --log "$OUT/prog1.jsonl"
stage cm python -m tdiff distill "${common[@]}" -m "$T" -o "$OUT/cm.safetensors" --method consistency \
  --from-steps 64 --to-steps 2 --max-minutes 10 --max-steps 100000 --lr-decay budget --log "$OUT/cm.jsonl"
stage frontier python -m bench.quality.frontier --judge "$JUDGE" --real "$REAL" \
  --num 256 --seed "$SEED" \
  --system "teacher@4=$T@4" --system "teacher@12=$T@12" --system "teacher@50=$T@50" \
  --system "prog4=$OUT/prog4.safetensors" --system "prog2=$OUT/prog2.safetensors" --system "prog1=$OUT/prog1.safetensors" \
  --system "cm@1=$OUT/cm.safetensors@1" --system "cm@2=$OUT/cm.safetensors@2" --system "cm@4=$OUT/cm.safetensors@4" \
  --plot "$OUT/frontier.png" > "$OUT/frontier.json"
echo DONE
