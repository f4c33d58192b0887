"""Data-parallel training through torchrun (gloo on CPU): two processes are the same run as one
process with the same global batch, a checkpoint moves between world sizes, a lost rank stops the
others, and a bad world size is refused (tdiff/training/distributed.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT, TINY

ENV = {"OMP_NUM_THREADS": "1", "PYTHONUTF8": "1"}


def torchrun(args, nproc=2, timeout=300):
    """`torchrun --standalone --nproc_per_node NPROC -m tdiff -- ARGS` (the `--` keeps torchrun's own
    option parser away from tdiff's options, e.g. --log)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "tdiff", "--", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, timeout=timeout, cwd=ROOT, env={**os.environ, **ENV})


def single(args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tdiff", *map(str, args)], capture_output=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, **ENV})


def _ok(r):
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    return r


def _losses(path):
    return [(r["step"], r["loss"]) for r in map(json.loads, path.read_text().splitlines())]


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def _same_losses(a, b, rel=1e-6):
    assert [s for s, _ in a] == [s for s, _ in b]
    assert all(abs(x - y) <= rel * abs(x) for (_, x), (_, y) in zip(a, b)), (a, b)


def _same_weights(a, b, atol=1e-6):
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    worst = max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)
    assert worst <= atol, worst


def _train_args(work, out, steps, *extra):
    return ["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", out, "--max-steps", steps,
            "--batch-size", "8", "--grad-accum", "2", "--warmup", "2", "--log-every", "1", "--log",
            out.with_suffix(".jsonl"), "--seed", "5", *TINY, *extra]


@pytest.fixture(scope="module")
def reference(work, tmp_path_factory):
    """4 steps of `train` in one process (global batch: 2 micro-batches of 8)."""
    one = tmp_path_factory.mktemp("ddp") / "one.safetensors"
    _ok(single(_train_args(work, one, 4)))
    return one


@pytest.mark.slow
def test_two_processes_are_one_run(work, tmp_path, reference):
    one, two = reference, tmp_path / "two.safetensors"
    r = _ok(torchrun(_train_args(work, two, 4)))
    a, b = _losses(one.with_suffix(".jsonl")), _losses(two.with_suffix(".jsonl"))
    assert [s for s, _ in a] == [1, 2, 3, 4]                                       # one log, written by rank 0
    _same_losses(a, b)
    _same_weights(one, two)
    assert r.stdout == b"" and b"Traceback" not in r.stderr


@pytest.mark.slow
def test_train_vae_two_processes_are_one_run(work, tmp_path):
    def args(out):
        return ["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, "--max-steps", "3",
                "--batch-size", "8", "--grad-accum", "2", "--latent-dim", "16", "--log-every", "1",
                "--log", out.with_suffix(".jsonl"), *TINY]

    _ok(single(args(tmp_path / "v1.safetensors")))
    _ok(torchrun(args(tmp_path / "v2.safetensors")))
    _same_losses(_losses(tmp_path / "v1.jsonl"), _losses(tmp_path / "v2.jsonl"))
    _same_weights(tmp_path / "v1.safetensors", tmp_path / "v2.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize("first,then", [(2, 1), (1, 2)])
def test_resume_across_world_sizes(work, tmp_path, reference, first, then):
    ref = reference
    out = tmp_path / "m.safetensors"
    run = {1: single, 2: torchrun}
    _ok(run[first](_train_args(work, out, 2)))
    _ok(run[then](_train_args(work, out, 4, "--resume")))
    assert [s for s, _ in _losses(out.with_suffix(".jsonl"))] == [1, 2, 3, 4]      # went on from step 2
    _same_losses(_losses(out.with_suffix(".jsonl"))[2:], _losses(ref.with_suffix(".jsonl"))[2:])
    _same_weights(ref, out)


@pytest.mark.slow
def test_the_defaults_are_shared_out(work, tmp_path):
    """The issue's command with no batch option (--batch-size 64 --grad-accum 1): the 2 processes share
    each batch as 2 micro-batches of 32, say so, and train exactly the run one process makes with
    --batch-size 32 --grad-accum 2."""
    def args(out, *extra):
        return ["train", "--vae", work / "vae.safetensors", "-i", work / "ids.jsonl", "-o", out, "--max-steps", "3",
                "--log-every", "1", "--log", out.with_suffix(".jsonl"), "--device", "cpu", *extra]

    two = tmp_path / "two.safetensors"
    r = _ok(torchrun(args(two)))
    assert b"2 processes: each batch of 64 is shared out as 2 micro-batches of 32" in r.stderr
    one = tmp_path / "one.safetensors"
    _ok(single(args(one, "--batch-size", "32", "--grad-accum", "2")))
    _same_losses(_losses(one.with_suffix(".jsonl")), _losses(two.with_suffix(".jsonl")))
    _same_weights(one, two)


def test_a_batch_that_cannot_be_shared_is_refused(work, tmp_path):
    r = torchrun(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", tmp_path / "x.safetensors",
                  "--max-steps", "2", "--batch-size", "7", "--grad-accum", "3", *TINY])
    assert r.returncode != 0
    assert "--batch-size 7 × --grad-accum 3 cannot be shared out between 2 processes" in r.stderr.decode(), r.stderr.decode()
    assert not (tmp_path / "x.safetensors").exists()        # (torchrun itself prints a traceback of its children)


def _children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return sorted(out)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_rank_stops_the_run(work, tmp_path, victim):
    """kill -9 of one worker: every process exits non-zero within 30 s, the checkpoint loads."""
    from tdiff.files.artifacts import load_artifact

    out = tmp_path / "k.safetensors"
    ck = tmp_path / "k.ckpt.safetensors"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "tdiff",
           "--", *map(str, _train_args(work, out, 100000, "--ckpt-every", "2"))]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, **ENV},
                         start_new_session=True)
    try:
        t0 = time.time()
        while not ck.exists() and time.time() - t0 < 120 and p.poll() is None:
            time.sleep(0.2)
        assert ck.exists(), "no checkpoint was written"
        workers = _children(p.pid)
        assert len(workers) == 2, workers
        os.kill(workers[victim], signal.SIGKILL)                # workers start in rank order
        t1 = time.time()
        _, err = p.communicate(timeout=60)
        took = time.time() - t1
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode != 0 and took < 30, (p.returncode, took)
    assert not [w for w in workers if os.path.exists(f"/proc/{w}") and
                open(f"/proc/{w}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]      # none left running
    if victim == 1:
        assert b"another process of this run stopped" in err and b"is intact" in err
    art = load_artifact(ck, expect="checkpoint")
    assert art.train["step"] >= 2 and all(torch.isfinite(v).all() for v in art.tensors.values() if v.is_floating_point())
    assert not out.exists()
