#!/usr/bin/env bash
# Nightly training under a time budget: resume the denoiser where last night stopped, then append
# tonight's samples and metrics. One cosine schedule spans the nights (--lr-decay steps: TOTAL_STEPS
# is the whole schedule, MINUTES what one night may spend; the default, budget, would anneal every night).
#
#   crontab -e
#   15 2 * * *  cd /srv/tdiff && RUN=run examples/cron/nightly.sh >> run/nightly.log 2>&1
#
# Needs RUN/ids.jsonl and RUN/vae.safetensors (e.g. from examples/pipeline/Makefile's `vae` target).
# A second copy started while one runs exits at once (flock); an interrupted night (SIGTERM) leaves
# its checkpoint, and the next night resumes from it.
set -euo pipefail
RUN=${RUN:-run}
MINUTES=${MINUTES:-60}
TOTAL_STEPS=${TOTAL_STEPS:-200000}
NUM=${NUM:-64}
NIGHT=${NIGHT:-$(date +%F)}
TDIFF=${TDIFF:-tdiff}
CONFIG=${CONFIG:-$(dirname "$0")/../pipeline/configs/train.yaml}

exec 9>"$RUN/.nightly.lock"
flock -n 9 || { echo "nightly: another run holds $RUN/.nightly.lock; skipping $NIGHT" >&2; exit 0; }

mkdir -p "$RUN/nights"
echo "nightly $NIGHT: training up to $MINUTES min (schedule of $TOTAL_STEPS steps)" >&2
$TDIFF train --config "$CONFIG" --resume --max-minutes "$MINUTES" --max-steps "$TOTAL_STEPS" \
  --lr-decay steps -i "$RUN/ids.jsonl" --vae "$RUN/vae.safetensors" -o "$RUN/model.safetensors" --log "$RUN/dit.jsonl"

# tonight's samples (seeded by the date, so a rerun of the same night gives the same texts)
SEED=$(printf '%s' "$NIGHT" | cksum | cut -d' ' -f1)
$TDIFF sample -m "$RUN/model.safetensors" -n "$NUM" --seed "$SEED" -o "$RUN/nights/$NIGHT.jsonl"

# one line of metrics per night, appended (the night and the step it reached first)
STEP=$(tail -n 1 "$RUN/dit.jsonl" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step"])')
$TDIFF eval --samples "$RUN/nights/$NIGHT.jsonl" --train "$RUN/ids.jsonl" -q \
  | python3 -c 'import json,sys; m=json.load(sys.stdin); print(json.dumps({"night": sys.argv[1], "step": int(sys.argv[2]), **m}, ensure_ascii=False))' \
    "$NIGHT" "$STEP" >> "$RUN/nightly_metrics.jsonl"
echo "nightly $NIGHT: step $STEP, samples in $RUN/nights/$NIGHT.jsonl, metrics appended to $RUN/nightly_metrics.jsonl" >&2
