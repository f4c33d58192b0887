#!/usr/bin/env bash
# Train (or reuse) the songci models that bench.quality.quality measures. Every stage is a
# plain `tdiff` command; a stage whose output exists is skipped (delete it to redo).
#
#   $OUT/train.txt, held.txt    songci poems; every 50th poem is held out (2%)
#   $OUT/text.jsonl, held.jsonl cleaned, chunked at MAX_CHARS (sentence-aware: about one
#                               stanza of a ci poem) so tiny models train in minutes on a CPU
#   $OUT/tok.model              SentencePiece unigram, jieba pre-tokenization, VOCAB pieces
#   $OUT/ids.jsonl, held_ids.jsonl
#   $OUT/vae.safetensors        tiny VAE                                 (VAE_MINUTES)
#   $OUT/model.safetensors      tiny DiT on its latents                  (DIT_MINUTES)
#   $OUT/judge/                 GPT-2 judge, train-ar preset tiny, JUDGE_STEPS steps (decayed to the floor):
#                               stronger than the baselines it judges; trained once and reused
#   $OUT/ar/                    GPT-2 baseline with tdiff's parameter count (±10%)  (AR_MINUTES)
#
# Usage, from the repository root: bash bench/quality/prepare_songci.sh   (SHARED=../shared, OUT=bench_out/songci)
set -euo pipefail
SHARED=${SHARED:-../shared}
OUT=${OUT:-bench_out/songci}
MAX_CHARS=${MAX_CHARS:-64}
VOCAB=${VOCAB:-8000}
VAE_MINUTES=${VAE_MINUTES:-8}
DIT_MINUTES=${DIT_MINUTES:-12}
JUDGE_STEPS=${JUDGE_STEPS:-2500}
AR_MINUTES=${AR_MINUTES:-6}
DTYPE=${DTYPE:-bf16}
SRC="$SHARED/data/songci.txt"
[ -r "$SRC" ] || { echo "prepare_songci: $SRC not found (set SHARED)" >&2; exit 66; }
mkdir -p "$OUT"
t() { printf '\n== %s ==\n' "$1" >&2; T0=$SECONDS; }
took() { echo "{\"stage\": \"$1\", \"seconds\": $((SECONDS - T0))}" >> "$OUT/stage_times.jsonl"; }

if [ ! -s "$OUT/held.txt" ]; then
  awk -v o="$OUT" 'NR % 50 == 0 { print > (o "/held.txt"); next } { print > (o "/train.txt") }' "$SRC"
fi
if [ ! -s "$OUT/ids.jsonl" ]; then
  t "clean + tokenize"
  tdiff clean --max-chars "$MAX_CHARS" --min-chars 4 -i "$OUT/train.txt" -o "$OUT/text.jsonl"
  tdiff clean --max-chars "$MAX_CHARS" --min-chars 4 -i "$OUT/held.txt" -o "$OUT/held.jsonl"
  rm -f "$OUT/tok.model" "$OUT/tok.vocab" "$OUT/tok.model.json"
  tdiff tokenize --tokenizer "$OUT/tok.model" --vocab-size "$VOCAB" --pretokenize jieba --jobs 2 \
    -i "$OUT/text.jsonl" -o "$OUT/ids.jsonl.tmp"
  tdiff tokenize --tokenizer "$OUT/tok.model" --pretokenize jieba -i "$OUT/held.jsonl" -o "$OUT/held_ids.jsonl"
  mv "$OUT/ids.jsonl.tmp" "$OUT/ids.jsonl"
  took tokenize
fi
if [ ! -s "$OUT/vae.safetensors" ]; then
  t "train-vae ($VAE_MINUTES min)"
  tdiff train-vae -i "$OUT/ids.jsonl" -t "$OUT/tok.model" -o "$OUT/vae.safetensors" --preset tiny \
    --max-steps 100000 --max-minutes "$VAE_MINUTES" --dtype "$DTYPE" --device cpu \
    --log "$OUT/vae_metrics.jsonl" --log-every 100 --resume
  took train-vae
fi
if [ ! -s "$OUT/model.safetensors" ]; then
  t "train ($DIT_MINUTES min)"
  tdiff train -i "$OUT/ids.jsonl" --vae "$OUT/vae.safetensors" -o "$OUT/model.safetensors" --preset tiny \
    --max-steps 100000 --max-minutes "$DIT_MINUTES" --dtype "$DTYPE" --device cpu \
    --log "$OUT/dit_metrics.jsonl" --log-every 100 --resume
  took train
fi
if [ ! -s "$OUT/judge/config.json" ]; then
  t "train-ar judge ($JUDGE_STEPS steps)"
  tdiff train-ar -i "$OUT/ids.jsonl" -t "$OUT/tok.model" -o "$OUT/judge" --preset tiny \
    --max-steps "$JUDGE_STEPS" --dtype "$DTYPE" --device cpu --seed 1 \
    --log "$OUT/judge_metrics.jsonl" --log-every 100 --resume
  took train-ar-judge
fi
if [ ! -s "$OUT/ar/config.json" ]; then
  # GPT-2 sized to tdiff's parameter count (VAE + DiT, what sampling runs), within ±10%.
  read -r NL NE NH < <(python -m bench.quality.ar_size "$OUT/model.safetensors")
  t "train-ar baseline ${NL}x${NE} ($AR_MINUTES min)"
  tdiff train-ar -i "$OUT/ids.jsonl" -t "$OUT/tok.model" -o "$OUT/ar" --n-layers "$NL" --d-model "$NE" --n-heads "$NH" \
    --max-steps 100000 --max-minutes "$AR_MINUTES" --dtype "$DTYPE" --device cpu --seed 2 \
    --log "$OUT/ar_metrics.jsonl" --log-every 100 --resume
  took train-ar-baseline
fi
echo "prepare_songci: models in $OUT" >&2
