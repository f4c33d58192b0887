"""bench/gpu_check.sh --dry-run on a machine without a GPU: its plumbing works (the corpus it builds,
the modules and tests it calls) and it lists every step a GPU machine would run, writing the JSON."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_dry_run_lists_every_cuda_step(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run(["bash", "bench/gpu_check.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for words in ("cuda_tests", "autocast", "bf16", "fp16", "--compile (CUDA graphs)", "torchrun --nproc_per_node=1",
                  "NCCL", "speed_small", "speed_base", "--device cuda"):
        assert words in r.stdout, f"{words!r} not in:\n{r.stdout}"
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert report["dry_run"] is True and {s["step"] for s in report["steps"]} >= {
        "machine", "cuda_tests", "train_vae_bf16", "train_fp16", "sample_eager", "sample_graphs", "single",
        "torchrun_1", "torchrun_n", "speed_small", "speed_base"}


def test_an_unknown_argument_is_a_usage_error():
    r = subprocess.run(["bash", "bench/gpu_check.sh", "--no-such"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 64 and "usage: bash bench/gpu_check.sh [--dry-run]" in r.stderr
