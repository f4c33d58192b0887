"""Hostile input: every command, fed what a careless user, a full disk or a signal gives it, fails
loudly with one line and a documented exit code, and never damages a good file.

Exit codes (man/tdiff.1): 2 usage, 65 bad data, 66 missing input, 73 output cannot be created,
74 read/write failed, 130 SIGINT, 143 SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY, one_line_error, read_fifo, run_cli, run_tdiff


def digest(path: Path) -> bytes:
    return path.read_bytes()


# ---------------------------------------------------------------- 1. special files as -o


def test_output_through_a_symlink_keeps_the_link(work, tmp_path):
    target = tmp_path / "real.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    r = run_cli(["clean", "-o", link, "--quiet"], input="床前明月光\n")
    assert r.returncode == 0, r.stderr.decode()
    assert link.is_symlink() and json.loads(target.read_text())["text"] == "床前明月光"


def test_output_to_a_fifo_writes_through(tmp_path):
    fifo = tmp_path / "pipe"
    t, got = read_fifo(fifo)
    r = run_tdiff(["clean", "-o", fifo, "--quiet"], input="疑是地上霜\n")
    t.join(30)
    assert r.returncode == 0, r.stderr.decode()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got["data"])["text"] == "疑是地上霜"


def test_output_to_dev_null_leaves_the_device(work):
    before = os.stat("/dev/null")
    r = run_tdiff(["clean", "-o", "/dev/null", "--quiet"], input="abc\n")
    assert r.returncode == 0, r.stderr.decode()
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


# ---------------------------------------------------------------- 2, 3. divergence


def test_divergence_keeps_the_last_good_checkpoint(work, tmp_path):
    out, ck = tmp_path / "v.safetensors", tmp_path / "v.ckpt.safetensors"
    base = ["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, "--batch-size", "8", *TINY]
    r = run_cli([*base, "--max-steps", "2"])
    assert r.returncode == 0, r.stderr.decode()
    good, model_before = digest(ck), digest(out)
    # resume with a rate that blows the weights up: the run fails, nothing good is replaced
    r = run_cli([*base, "--max-steps", "40", "--lr", "1e38", "--warmup", "0", "--ckpt-every", "1", "--resume"])
    one_line_error(r, 1, "good checkpoint")
    assert digest(ck) == good and digest(out) == model_before
    r = run_cli([*base, "--max-steps", "3", "--resume"])                 # and the good checkpoint still resumes
    assert r.returncode == 0, r.stderr.decode()


def test_a_model_that_diverges_in_its_last_step_is_not_written(tmp_path):
    """The loop itself: weights that turn non-finite are never saved, and the run fails."""
    import torch

    from tdiff.core.errors import TdiffError
    from tdiff.training.loop import LoopConfig, Trainer

    model = torch.nn.Linear(4, 1)
    ck = tmp_path / "c.safetensors"

    def step_fn(step, micro):
        x = torch.ones(8, 4)
        return model(x).pow(2).mean(), {}, 8

    tr = Trainer(model, step_fn, LoopConfig(max_steps=1, lr=1e-3, warmup_steps=0), torch.device("cpu"), ckpt_path=ck)
    tr.run()
    good = digest(ck)
    with torch.no_grad():
        model.weight.fill_(float("nan"))
    tr2 = Trainer(model, step_fn, LoopConfig(max_steps=2, lr=1e-3, warmup_steps=0, ema_decay=0),
                  torch.device("cpu"), ckpt_path=ck)
    tr2.step = 1
    with pytest.raises(TdiffError):
        tr2.run()
    assert digest(ck) == good


# ---------------------------------------------------------------- 4, 5: tests/training/test_signals.py


# ---------------------------------------------------------------- 6. unwritable outputs, full disk


@pytest.mark.parametrize("where", ["/proc/tdiff-out", "DIR"])
def test_unwritable_output_is_refused_before_training(work, tmp_path, where):
    out = tmp_path if where == "DIR" else where
    t0 = time.time()
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out,
                   "--max-steps", "100000", *TINY])
    one_line_error(r, 73, "-o/--output")
    assert time.time() - t0 < 30


def test_full_disk_on_stdout_is_one_line(work):
    with open("/dev/full", "wb") as full:
        p = subprocess.run([sys.executable, "-m", "tdiff", "clean"], input=("a" * 100 + "\n").encode() * 2000,
                           stdout=full, stderr=subprocess.PIPE, cwd=ROOT)
    err = p.stderr.decode()
    assert p.returncode == 74 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- 7, 8. Unicode and JSON limits


def test_lone_surrogates(work, tmp_path):
    bad = '{"text": "a\\ud800b"}\n'
    r = run_cli(["clean", "--jsonl", "--quiet"], input=bad)                # repaired, counted, not fatal
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout)["text"] == "a\ufffdb"
    r = run_cli(["clean", "--jsonl", "--strict"], input=bad)
    one_line_error(r, 65, "<stdin>:1")
    r = run_cli(["tokenize", "--tokenizer", work / "tok.model"], input=bad)
    one_line_error(r, 65, ":1")
    r = run_cli(["tokenize", "--tokenizer", tmp_path / "new.model", "--vocab-size", "300"],
                  input='{"text": "ok"}\n' + bad)
    one_line_error(r, 65, ":2")


@pytest.mark.parametrize("line", ["[" * 100_000 + "]" * 100_000, '{"ids": [' + "9" * 5000 + "]}"])
def test_json_limits(work, line):
    r = run_tdiff(["clean", "--jsonl"], input=line + "\n")
    one_line_error(r, 65, ":1")
    r = run_tdiff(["train", "-i", "-", "--vae", work / "vae.safetensors", "-o", "/dev/null", *TINY], input=line + "\n")
    one_line_error(r, 65, ":1")


# ---------------------------------------------------------------- 9, 10. options


OPTION_CASES = [
    (["train-vae", "--batch-size", "0"], "--batch-size"),
    (["train-vae", "--log-every", "0"], "--log-every"),
    (["train-vae", "--lr", "-1"], "--lr"),
    (["train-vae", "--lr", "nan"], "--lr"),
    (["train-vae", "--lr", "inf"], "--lr"),
    (["train-vae", "--latent-dim", "0"], "--latent-dim"),
    (["train-vae", "--latent-stride", "8"], "--latent-stride"),
    (["train-vae", "--max-len", "-8"], "--max-len"),
    (["train-vae", "--holdout", "1.0"], "--holdout"),
    (["train-vae", "--seed", "100000000000000000000000"], "--seed"),
    (["train-vae", "--max-steps", "0"], "--max-steps"),
    (["train-vae", "--max-steps", "-1"], "--max-steps"),
    (["train-vae", "--grad-accum", "0"], "--grad-accum"),
    (["train-vae", "--batch-size", "-3"], "--batch-size"),
    (["train", "--cond-prob", "5"], "--cond-prob"),
    (["train", "--eval-every", "-1"], "--eval-every"),
    (["sample", "--dtype", "fp8"], "--dtype"),
    (["sample", "--temperature", "nan"], "--temperature"),
    (["sample", "--temperature", "-1"], "--temperature"),
    (["sample", "--solver", "ddim", "--eta", "-3"], "--eta"),
    (["sample", "--top-k", "-5"], "--top-k"),
    (["sample", "--top-p", "1.5"], "--top-p"),
    (["sample", "--length", "-4"], "--length"),
    (["sample", "--steps", "0"], "--steps"),
    (["sample", "--time-grid", "bogus"], "--time-grid"),
    (["sample", "--mask-len", "0"], "--mask-len"),
    (["sample", "--guidance", "-1"], "--guidance"),
    (["sample", "--guidance", "inf"], "--guidance"),
    (["sample", "--segments", "0"], "--segments"),
    (["sample", "--overlap", "-1"], "--overlap"),
    (["sample", "--repetition-penalty", "0.5"], "--repetition-penalty"),
    (["train", "--label-dropout", "2"], "--label-dropout"),
    (["eval", "--t-samples", "0"], "--t-samples"),
    (["tokenize", "--vocab-size", "0"], "--vocab-size"),
]


@pytest.mark.parametrize("args,option", OPTION_CASES, ids=[" ".join(a) for a, _ in OPTION_CASES])
def test_bad_option_values_are_usage_errors(tmp_path, args, option, capsys):
    """Refused while parsing, before any input is opened: the input paths need not exist."""
    cmd, rest = args[0], args[1:]
    work = tmp_path
    need = {"train-vae": ["-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", "/dev/null"],
            "train": ["-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", "/dev/null"],
            "sample": ["-m", work / "model.safetensors"], "eval": ["-m", work / "model.safetensors"],
            "tokenize": ["--tokenizer", "/nonexistent/new.model"]}[cmd]
    r = run_cli([cmd, *need, *rest, "--device", "cpu"] if cmd != "tokenize" else [cmd, *need, *rest])
    one_line_error(r, 2, option)


def test_bad_option_values_as_a_user_runs_them(work):
    """Two of the cases above through the real entry point, in a subprocess."""
    r = run_tdiff(["sample", "-m", work / "model.safetensors", "--temperature", "nan"])
    one_line_error(r, 2, "--temperature")
    r = run_tdiff(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", "/dev/null",
                   "--batch-size", "0"])
    one_line_error(r, 2, "--batch-size")


# ---------------------------------------------------------------- 11, 12. directories, crafted files, pickles


def _crafted(path: Path, header) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw)
    return path


@pytest.mark.slow
def test_directories_and_crafted_files(work, tmp_path):
    r = run_tdiff(["sample", "-m", tmp_path, "--device", "cpu"])
    one_line_error(r, 65, str(tmp_path))
    r = run_tdiff(["train", "-i", work / "ids.jsonl", "--vae", tmp_path, "-o", tmp_path / "m.safetensors", *TINY])
    one_line_error(r, 65, str(tmp_path))
    meta = {"tdiff.format": "1", "tdiff.kind": "model"}
    cases = {
        "list.safetensors": [1, 2],
        "badcfg.safetensors": {"__metadata__": {**meta, "config": "{not json"}},
        "noschedule.safetensors": {"__metadata__": {**meta, "config": "{}"}},
        "badtok.safetensors": {"__metadata__": {**meta, "config": "{}", "tokenizer": "!!!not base64!!!"}},
        "badmeta.safetensors": {"__metadata__": [1]},
    }
    for name, header in cases.items():
        r = run_tdiff(["sample", "-m", _crafted(tmp_path / name, header), "--device", "cpu"])
        one_line_error(r, 65, name)


def test_resume_from_a_directory_checkpoint(work, tmp_path):
    (tmp_path / "ck").mkdir()
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp_path / "v.safetensors",
                   "--checkpoint", tmp_path / "ck", "--resume", "--max-steps", "1", *TINY])
    one_line_error(r, 73, "--checkpoint")


def test_ar_directories_with_pickled_weights_are_refused(work, tmp_path):
    lm = tmp_path / "lm"
    r = run_tdiff(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", lm, "--n-layers", "1",
                   "--d-model", "32", "--n-heads", "2", "--max-steps", "1", "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    (lm / "model.safetensors").rename(lm / "pytorch_model.bin")            # what a pickle-only directory holds
    r = run_tdiff(["sample", "-m", lm, "--device", "cpu"])
    one_line_error(r, 65, "model.safetensors")


# ---------------------------------------------------------------- 13-16


def test_closed_pipe_exits_0(work):
    p = subprocess.Popen([sys.executable, "-m", "tdiff", "sample", "-m", str(work / "model.safetensors"), "--num",
                          "300", "--batch-size", "1", "--steps", "1", "--device", "cpu", "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    p.stdout.readline()
    p.stdout.close()                                                       # `| head -1`
    err = p.stderr.read()
    assert p.wait(120) == 0, err.decode()
    assert b"Traceback" not in err


def test_outputs_get_the_umask_mode(work, tmp_path):
    out = tmp_path / "v.safetensors"
    old = os.umask(0o022)
    try:
        r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, "--max-steps", "1",
                       "--batch-size", "8", *TINY])
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr.decode()
    assert stat.S_IMODE(out.stat().st_mode) == 0o644


def test_a_bad_tokenizer_names_the_option_it_came_from(work, tmp_path):
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"not a model at all")
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", garbage, "-o", tmp_path / "v.safetensors", *TINY])
    err = one_line_error(r, 65, "-t/--tokenizer")
    assert "--model" not in err


def _start(args):
    env = dict(os.environ, PYTHONUTF8="1")
    return subprocess.Popen([sys.executable, "-m", "tdiff", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)


def test_sigterm_during_sample_leaves_no_temp_and_stale_temps_are_removed(work, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"text": "keep me"}\n')
    stale = tmp_path / f".out.jsonl.{2**22 + 12345}.abcd.tmp"          # a temp of a process that is gone
    stale.write_text("x")
    p = _start(["sample", "-m", work / "model.safetensors", "-o", out, "--num", "100000", "--batch-size", "1",
                "--steps", "1", "--device", "cpu"])
    t0 = time.time()
    while not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp") and f != stale]:
        assert time.time() - t0 < 60 and p.poll() is None, p.stderr.read().decode() if p.poll() is not None else ""
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143 and b"Traceback" not in err, err.decode()
    assert out.read_text() == '{"text": "keep me"}\n'                     # the old output is untouched
    assert not [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")]


# ---------------------------------------------------------------- cases that already held (kept so they stay so)


@pytest.mark.slow
def test_inputs_that_were_already_handled(work, tmp_path):
    r = run_tdiff(["clean", "--strict"], input=b"ok\n\xff\xfe bad\n")
    one_line_error(r, 65, "<stdin>:2")
    r = run_tdiff(["clean", "--quiet"], input=b"\xef\xbb\xbfbom\r\nline\x00two\n")
    assert r.returncode == 0 and b"bom" in r.stdout and b"\\ufeff" not in r.stdout
    r = run_tdiff(["train", "-i", "-", "--vae", work / "vae.safetensors", "-o", "/dev/null", *TINY],
                  input='{"ids": [5, 6]}\n{"ids": [5,\n')
    one_line_error(r, 65, ":2")
    r = run_tdiff(["sample", "-m", work / "text.jsonl", "--device", "cpu"])
    one_line_error(r, 65)
    big = "长" * ((16 << 20) // 3) + "\n"                                  # one 16 MB line
    r = run_tdiff(["clean", "--max-chars", "64", "--quiet"], input=big)
    assert r.returncode == 0 and len(r.stdout.splitlines()) > 1000, r.stderr.decode()
    r = run_tdiff(["sample", "-m", tmp_path / "missing.safetensors", "--device", "cpu"])
    one_line_error(r, 66)
    (tmp_path / "c.yaml").write_text("lr: [unclosed\n")
    r = run_tdiff(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp_path / "v.safetensors",
                   "--config", tmp_path / "c.yaml"])
    one_line_error(r, 2, "YAML")
    r = run_tdiff(["sample", "-m", work / "model.safetensors", "--device", "tpu"])
    assert r.returncode == 2 and b"Traceback" not in r.stderr
    r = run_tdiff(["sample", "-m", work / "model.safetensors", "--dtype", "int3"])
    one_line_error(r, 2, "--dtype")
