#!/usr/bin/env bash
# One timed training run on the songci data of bench/quality/prepare_songci.sh, for ablations and the
# equal-minutes comparison of docs/RESULTS.md ("Headline: AR-equivalent minutes at 20 CPU-minutes, two seeds
# (machine C)"). Every stage is a plain `tdiff` command.
#
#   bash bench/quality/recipe.sh tdiff RUN_DIR SEED   VAE (VAE_MINUTES) then DiT (DIT_MINUTES) → RUN_DIR/model.safetensors
#   bash bench/quality/recipe.sh vae   RUN_DIR SEED   VAE only (VAE_MINUTES) → RUN_DIR/vae.safetensors
#   bash bench/quality/recipe.sh dit   RUN_DIR SEED   DiT only (DIT_MINUTES) on an existing VAE=path
#   bash bench/quality/recipe.sh ar    RUN_DIR SEED   GPT-2 baseline (AR_MINUTES), sized like SIZE_OF=model.safetensors
#
# Run it from the repository root (the `ar` mode sizes the baseline with `python -m bench.quality.ar_size`).
#
# Environment: DATA (bench_out/songci: ids.jsonl, tok.model), VAE_ARGS, DIT_ARGS, AR_ARGS (extra flags),
# CPUS (taskset core list, e.g. 0; default: no pinning), THREADS (torch threads; default: all cores),
# DTYPE (bf16). The stage times go to RUN_DIR/stage_times.jsonl. A run under a time budget needs its
# cores to itself: run two at once only pinned to different cores (CPUS=0 / CPUS=1, THREADS=1).
set -euo pipefail
MODE=${1:?mode: tdiff|vae|dit|ar}; RUN=${2:?run dir}; SEED=${3:?seed}
DATA=${DATA:-bench_out/songci}
VAE_MINUTES=${VAE_MINUTES:-5}; DIT_MINUTES=${DIT_MINUTES:-15}; AR_MINUTES=${AR_MINUTES:-20}
DTYPE=${DTYPE:-bf16}
mkdir -p "$RUN"
PIN=()
[ -n "${CPUS:-}" ] && PIN=(taskset -c "$CPUS")
[ -n "${THREADS:-}" ] && export OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
stage() {  # stage NAME command...
  local name=$1; shift
  local t0=$SECONDS
  "${PIN[@]}" "$@" 2> "$RUN/$name.log"
  echo "{\"stage\": \"$name\", \"seconds\": $((SECONDS - t0)), \"cpus\": \"${CPUS:-all}\", \"threads\": \"${THREADS:-default}\"}" >> "$RUN/stage_times.jsonl"
}
common=(--max-steps 100000 --dtype "$DTYPE" --device cpu --seed "$SEED" --log-every 100)
case "$MODE" in
  tdiff|vae)
    # shellcheck disable=SC2086
    stage train-vae tdiff train-vae -i "$DATA/ids.jsonl" -t "$DATA/tok.model" -o "$RUN/vae.safetensors" \
      --max-minutes "$VAE_MINUTES" --log "$RUN/vae_metrics.jsonl" "${common[@]}" ${VAE_ARGS:-}
    VAE="$RUN/vae.safetensors"
    [ "$MODE" = vae ] && { echo "recipe.sh: vae done in $RUN" >&2; exit 0; } ;&
  dit)
    VAE=${VAE:?set VAE=path to a vae.safetensors}
    # shellcheck disable=SC2086
    stage train tdiff train -i "$DATA/ids.jsonl" --vae "$VAE" -o "$RUN/model.safetensors" \
      --max-minutes "$DIT_MINUTES" --log "$RUN/dit_metrics.jsonl" "${common[@]}" ${DIT_ARGS:-} ;;
  ar)
    read -r NL NE NH < <(python -m bench.quality.ar_size "${SIZE_OF:?set SIZE_OF=a tdiff model.safetensors}")
    # shellcheck disable=SC2086
    stage train-ar tdiff train-ar -i "$DATA/ids.jsonl" -t "$DATA/tok.model" -o "$RUN/ar" \
      --n-layers "$NL" --d-model "$NE" --n-heads "$NH" --max-minutes "$AR_MINUTES" \
      --log "$RUN/ar_metrics.jsonl" "${common[@]}" ${AR_ARGS:-} ;;
  *) echo "recipe.sh: unknown mode $MODE (tdiff|vae|dit|ar)" >&2; exit 64 ;;
esac
echo "recipe.sh: $MODE done in $RUN" >&2
