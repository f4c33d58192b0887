#!/usr/bin/env bash
# The CUDA check of tdiff: one unattended run on a machine with a GPU and a fresh checkout, within
# GPU_CHECK_SECONDS (default 480: 8 minutes), every figure as JSON in $OUT (default ./gpu_check_out):
# gpu_check.json (all steps and figures), gpu_check.log (every command's output), speed_small.json and
# speed_base.json.
#
#   bash bench/gpu_check.sh            # on the GPU machine, from the repository root
#   bash bench/gpu_check.sh --dry-run  # on any machine: checks the script's own plumbing, prints each step
#
# Steps: the machine (nvidia-smi, torch, CUDA); a torch with CUDA (the one there, else the CUDA build of
# the locked version from the PyTorch index); the tests that touch CUDA; train-vae and train a few steps in
# bf16 and fp16 autocast; sampling eager against --compile (CUDA graphs), token agreement; torchrun
# --nproc_per_node=1 (and =N with N GPUs) on NCCL against one process; the speed table (bench.speed.speed_vs_ar)
# for the small and base presets against the compiled static-cache AR. A failing step is recorded and the
# next one runs. PYTHON picks the interpreter (default: .venv/bin/python if there, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash bench/gpu_check.sh [--dry-run]" >&2; exit 64 ;;
esac
OUT=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=$ROOT/.venv/bin/python; else PY=python3; fi
export PYTHONUNBUFFERED=1 TDIFF_SHARED="$WORK/shared"   # tdiff and bench import from the repository root (the working directory)
LOG=$OUT/gpu_check.log
STEPS=$WORK/steps.jsonl
: > "$LOG"
: > "$STEPS"
TDIFF=("$PY" -m tdiff)
T0=$SECONDS
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-480}))   # the whole run; each step is cut at what is left

# step NAME SECONDS WHAT -- COMMAND...: run COMMAND (at most SECONDS, and never past DEADLINE: then rc 124),
# append its output to the log and one JSON line {step, what, rc, seconds} to the step list; --dry-run
# prints the step instead.
step() {
  local name=$1 secs=$2 what=$3
  shift 4
  if [ "$DRY" = 1 ]; then
    printf 'step %-18s (at most %3ss) %s\n    %s\n' "$name" "$secs" "$what" "$*"
    printf '{"step": "%s", "what": "%s", "rc": null, "seconds": 0}\n' "$name" "$what" >> "$STEPS"
    return 0
  fi
  local t=$SECONDS rc left=$((DEADLINE - SECONDS))
  [ "$left" -lt "$secs" ] && secs=$left
  echo "== $name: $*" >> "$LOG"
  if [ "$secs" -gt 0 ]; then
    timeout "$secs" "$@" >> "$LOG" 2>&1
    rc=$?
  else
    echo "   (no time left in GPU_CHECK_SECONDS)" >> "$LOG"
    rc=124
  fi
  echo "   ($name: rc $rc, $((SECONDS - t)) s)" >> "$LOG"
  printf '{"step": "%s", "what": "%s", "rc": %d, "seconds": %d}\n' "$name" "$what" "$rc" "$((SECONDS - t))" >> "$STEPS"
  return $rc
}

# ------------------------------------------------------------------ the plumbing (both modes)

for f in constraints.txt bench/speed/speed_vs_ar.py tests/models/test_models.py tests/export/test_export.py; do
  [ -f "$f" ] || { echo "gpu_check: $f is missing: run from a tdiff checkout" >&2; exit 66; }
done
"$PY" -c "import torch, tdiff" 2>/dev/null || { echo "gpu_check: $PY cannot import torch and tdiff" >&2; exit 69; }
# A corpus the check can build anywhere: the repository's own prose, cleaned (no corpus travels with it).
mkdir -p "$WORK/shared/data"
cat README.md docs/*.md man/*.1 man/*.7 | sed 's/\\f[BIR]//g; s/\\-/-/g; /^\./d' > "$WORK/raw.txt"
"${TDIFF[@]}" clean --max-chars 100 --min-chars 20 -i "$WORK/raw.txt" -o "$WORK/text.jsonl" --quiet \
  || { echo "gpu_check: cleaning the corpus failed" >&2; exit 70; }
"$PY" -c "import json, sys; [print(json.loads(l)['text']) for l in open(sys.argv[1], encoding='utf-8')]" \
  "$WORK/text.jsonl" > "$WORK/shared/data/songci.txt"     # the tests' corpus slot ($TDIFF_SHARED/data)
"${TDIFF[@]}" tokenize -t "$WORK/tok.model" --vocab-size 1000 -i "$WORK/text.jsonl" -o "$WORK/ids.jsonl" --quiet \
  || { echo "gpu_check: tokenizing the corpus failed" >&2; exit 70; }
"$PY" -m bench.speed.speed_vs_ar --help > /dev/null || { echo "gpu_check: bench.speed.speed_vs_ar does not run" >&2; exit 70; }
"$PY" -m pytest -q -p no:cacheprovider --collect-only -k "cuda" tests/models/test_models.py \
  tests/export/test_export.py > /dev/null || { echo "gpu_check: the CUDA tests do not collect" >&2; exit 70; }
echo "gpu_check: corpus of $(wc -l < "$WORK/text.jsonl") records, tokenizer of 1000 pieces, python $PY" >&2

# ------------------------------------------------------------------ the steps

GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$DRY" = 0 ] && [ "$GPUS" = 0 ]; then
  # No CUDA in this torch: install the CUDA build of the locked version (needs the PyTorch index).
  LOCKED=$(grep '^torch==' constraints.txt | head -1)
  step torch_cuda 240 "install the CUDA build of the locked torch" -- \
    "$PY" -m pip install -q "$LOCKED" --index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cu124}"
  GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  [ "$GPUS" = 0 ] && echo "gpu_check: no CUDA device visible to torch; the CUDA steps will fail" >&2
fi
step machine 30 "the GPU, driver, torch and CUDA versions" -- sh -c "'$PY' -c \"import json, torch; \
d = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, \
'gpus': torch.cuda.device_count(), 'name': torch.cuda.get_device_name(0) if d else None, \
'capability': list(torch.cuda.get_device_capability(0)) if d else None, \
'bf16': bool(d and torch.cuda.is_bf16_supported())}))\" > '$WORK/machine.json'; nvidia-smi || true"
step cuda_tests 150 "the tests that touch CUDA: autocast on the VAE and DiT, CUDA graphs under --compile" -- \
  "$PY" -m pytest -q -p no:cacheprovider -rA -k "cuda" tests/models/test_models.py tests/export/test_export.py
for dt in bf16 fp16; do
  step "train_vae_$dt" 90 "train-vae, 40 steps, $dt autocast on cuda" -- \
    "${TDIFF[@]}" train-vae -i "$WORK/ids.jsonl" -t "$WORK/tok.model" -o "$WORK/vae_$dt.safetensors" --preset tiny \
    --latent-dim 16 --max-steps 40 --batch-size 32 --device cuda --dtype "$dt" --log "$WORK/vae_$dt.jsonl" --log-every 10 -q
  step "train_$dt" 90 "train (the DiT), 40 steps, $dt autocast on cuda" -- \
    "${TDIFF[@]}" train -i "$WORK/ids.jsonl" --vae "$WORK/vae_$dt.safetensors" -o "$WORK/m_$dt.safetensors" \
    --preset tiny --max-steps 40 --batch-size 32 --device cuda --dtype "$dt" --log "$WORK/m_$dt.jsonl" --log-every 10 -q
done
M=$WORK/m_bf16.safetensors
step sample_eager 60 "sample, eager, fp32 on cuda" -- \
  "${TDIFF[@]}" sample -m "$M" -n 32 --batch-size 16 --steps 12 --seed 3 --dtype fp32 --device cuda -o "$WORK/eager.jsonl" -q
step sample_graphs 150 "sample with --compile (CUDA graphs), the same seed" -- \
  "${TDIFF[@]}" sample -m "$M" -n 32 --batch-size 16 --steps 12 --seed 3 --dtype fp32 --device cuda --compile \
  -o "$WORK/graphs.jsonl" -q
TRAIN=(train -i "$WORK/ids.jsonl" --vae "$WORK/vae_bf16.safetensors" --preset tiny --max-steps 20 --batch-size 32
       --device cuda --seed 5 -q)
step single 60 "train 20 steps in one process (the reference)" -- "${TDIFF[@]}" "${TRAIN[@]}" -o "$WORK/one.safetensors"
step torchrun_1 90 "torchrun --nproc_per_node=1, NCCL" -- \
  "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m tdiff -- "${TRAIN[@]}" -o "$WORK/tr1.safetensors"
if [ "$DRY" = 1 ] || [ "$GPUS" -gt 1 ]; then
  N=$([ "$DRY" = 1 ] && echo N || echo "$GPUS")
  step torchrun_n 90 "torchrun --nproc_per_node=N (N GPUs, when more than one), NCCL" -- \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node="$N" -m tdiff -- "${TRAIN[@]}" -o "$WORK/trn.safetensors"
fi
for preset in small base; do
  step "model_$preset" 120 "a $preset VAE and DiT (30 steps each) for the speed table" -- sh -c \
    "'$PY' -m tdiff train-vae -i '$WORK/ids.jsonl' -t '$WORK/tok.model' -o '$WORK/v_$preset.safetensors' \
--preset $preset --max-steps 30 --batch-size 32 --device cuda -q && '$PY' -m tdiff train -i '$WORK/ids.jsonl' \
--vae '$WORK/v_$preset.safetensors' -o '$WORK/s_$preset.safetensors' --preset $preset --max-steps 30 \
--batch-size 32 --device cuda -q"
  step "speed_$preset" 150 "speed table, $preset: dpm 4/12 and blocks of 16/4 at batch 1 and 64, bf16, compiled both sides, vs the AR" -- \
    sh -c "'$PY' -m bench.speed.speed_vs_ar --model '$WORK/s_$preset.safetensors' --device cuda --dtype bf16 \
--batch 1,64 --steps 4,12 --block-size 16,4 --compile both > '$OUT/speed_$preset.json'"
done

# ------------------------------------------------------------------ the figures, in one JSON object

"$PY" - "$WORK" "$OUT" "$STEPS" "$DRY" "$((SECONDS - T0))" <<'PY'
import json, sys
from pathlib import Path

work, out, steps, dry, seconds = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
rows = [json.loads(line) for line in steps.read_text().splitlines()]
report = {"dry_run": dry, "seconds": seconds, "steps": rows, "figures": {}}
fig = report["figures"]


def last_log(name):
    p = work / name
    lines = p.read_text().splitlines() if p.exists() else []
    return json.loads(lines[-1]) if lines else None


def records(name):
    p = work / name
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


for dt in ("bf16", "fp16"):
    for what, log in (("train_vae", f"vae_{dt}.jsonl"), ("train", f"m_{dt}.jsonl")):
        rec = last_log(log)
        if rec:
            fig[f"{what}_{dt}"] = {k: rec.get(k) for k in ("step", "loss", "tokens_per_s", "elapsed_s")}
eager, graphs = records("eager.jsonl"), records("graphs.jsonl")
if eager and graphs:
    same = sum(a == b for x, y in zip(eager, graphs) for a, b in zip(x["ids"], y["ids"]))
    total = sum(len(x["ids"]) for x in eager)
    fig["cuda_graphs_vs_eager"] = {"samples": len(eager), "tokens": total, "same_token_share": round(same / max(total, 1), 4)}


def tensors(name):
    p = work / name
    if not p.exists():
        return None
    from safetensors.torch import load_file
    return load_file(str(p))


ref = tensors("one.safetensors")
for name in ("tr1", "trn"):
    got = tensors(f"{name}.safetensors")
    if ref is not None and got is not None:
        diff = max(float((ref[k].float() - got[k].float()).abs().max()) for k in ref if k.startswith("dit_ema."))
        fig[f"torchrun_{name}_vs_one_process"] = {"max_abs_diff_dit_ema": diff, "equal": diff == 0.0}
for preset in ("small", "base"):
    p = out / f"speed_{preset}.json"
    if p.exists() and p.stat().st_size:
        try:
            fig[f"speed_{preset}"] = json.loads(p.read_text())
        except ValueError:
            fig[f"speed_{preset}"] = "unreadable (see gpu_check.log)"
if (work / "machine.json").exists():
    report["machine"] = json.loads((work / "machine.json").read_text())
(out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n")
failed = [r["step"] for r in rows if r["rc"] not in (0, None)]
print(f"gpu_check: {len(rows)} steps{' (dry run)' if dry else ''}, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
      f"{out / 'gpu_check.json'}", file=sys.stderr)
sys.exit(1 if failed else 0)
PY
