"""Nothing lost (the 2026-12-05 audit): outputs that are not regular files are written through, never
replaced; a failure after training names the checkpoint that holds the weights and the command that
finishes the job; the same file as input and output, a dangling symlink, an unwritable --log are refused
before any work, creating nothing; file modes are kept; a closed stdout, YAML booleans and nan are
one-line errors."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import ROOT, TINY
from conftest import one_line_error, read_fifo, run_cli

FAST = ["--max-steps", "2", "--batch-size", "8", *TINY]


def _vae_args(work, out, *extra):
    return ["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, "--latent-dim", "8",
            *FAST, *extra]


def _train_args(work, out, *extra):
    return ["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", out, *FAST, *extra]


# ---------------------------------------------------------------- 1 and 2: devices, FIFOs, failures after training


def test_a_device_output_stays_a_device_and_the_weights_are_kept(work, tmp_path, capsys):
    """-o /dev/full: the device is written through (ENOSPC, exit 74), not replaced by a file; the
    message names the checkpoint and the command that finishes the job, and that command works."""
    before = os.stat("/dev/full")
    ck = tmp_path / "v.ckpt.safetensors"
    r = run_cli(_vae_args(work, "/dev/full", "--checkpoint", ck))
    err = one_line_error(r, 74, "No space left on device", f"the trained weights are safe in the checkpoint {ck}",
                         "finish the job with: tdiff train-vae", "--resume")
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    # the finishing command, with another -o: no step is trained again, the VAE is written
    cmd = err.split("finish the job with: ", 1)[1].strip().split()[1:]
    cmd[cmd.index("-o") + 1] = str(tmp_path / "v.safetensors")
    r = run_cli(cmd)
    assert r.returncode == 0, r.stderr.decode()
    from tdiff.files.artifacts import load_artifact

    assert load_artifact(tmp_path / "v.safetensors", expect="vae").train["steps"] == 2


def test_a_fifo_output_is_written_through(work, tmp_path):
    """train -o FIFO: a reader gets the model's bytes; the FIFO stays a FIFO (a subprocess: the
    reader thread must not share the interpreter's signal handling)."""
    fifo = tmp_path / "model.fifo"
    t, got = read_fifo(fifo)
    r = subprocess.run([sys.executable, "-m", "tdiff", *map(str, _train_args(work, fifo, "--checkpoint",
                                                                              tmp_path / "ck.safetensors"))],
                       capture_output=True, cwd=ROOT, timeout=300)
    t.join(60)
    assert r.returncode == 0, r.stderr.decode()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    from safetensors.torch import load

    assert any(k.startswith("dit.") for k in load(got["data"]))


def test_a_device_checkpoint_is_written_through(work, tmp_path, capsys):
    """--checkpoint /dev/null: training runs, /dev/null stays the device, nothing is linked beside it."""
    before = os.stat("/dev/null")
    r = run_cli(_vae_args(work, tmp_path / "v.safetensors", "--checkpoint", "/dev/null",
                                 "--ckpt-every", "1"))
    assert r.returncode == 0, r.stderr.decode()
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert not os.path.exists("/dev/null.prev")


def test_train_ar_failing_after_training_keeps_the_weights(work, tmp_path, capsys, monkeypatch):
    """The last step of train-ar (writing the transformers directory) made to fail: exit 1, the error
    names the checkpoint and the finishing command; that command writes a directory that loads."""
    from tdiff.training import train_ar

    def broken(*a, **k):
        raise ValueError("`tiktoken` is required to read a `tiktoken` file")

    out, ck = tmp_path / "ar", tmp_path / "ar.ckpt.safetensors"
    args = ["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, *FAST]
    with monkeypatch.context() as m:
        m.setattr(train_ar, "save_ar", broken)
        r = run_cli(args)
    err = one_line_error(r, 1, "tiktoken", f"the trained weights are safe in the checkpoint {ck} (step 2)",
                         f"--checkpoint {ck} --resume")
    assert not out.exists() and ck.is_file()
    r = run_cli(err.split("finish the job with: ", 1)[1].strip().split()[1:])
    assert r.returncode == 0, r.stderr.decode()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).decode([5, 6]) and AutoModelForCausalLM.from_pretrained(out)
    assert json.loads((out / "tdiff.json").read_text())["train"]["steps"] == 2


def test_train_ar_checks_the_tokenizer_conversion_before_training(work, tmp_path, capsys, monkeypatch):
    """A transformers that cannot convert the tokenizer fails in seconds, before any step."""
    from tdiff.formats import ar_dir

    def broken(*a, **k):
        raise ValueError("`tiktoken` is required to read a `tiktoken` file")

    monkeypatch.setattr(ar_dir, "write_transformers_tokenizer", broken)
    r = run_cli(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp_path / "ar",
                        *FAST])
    one_line_error(r, 1, "cannot convert the tokenizer for AutoTokenizer", "tiktoken")
    assert not (tmp_path / "ar.ckpt.safetensors").exists() and not (tmp_path / "ar").exists()


# ---------------------------------------------------------------- 11: the same file as input and output

SAME = [
    (["tokenize", "--tokenizer", "{w}/tok.model", "-i", "{w}/text.jsonl", "-o", "{w}/tok.model"], "-t/--tokenizer", "tok.model"),
    (["train-vae", "-i", "{w}/ids.jsonl", "-t", "{w}/tok.model", "-o", "{w}/ids.jsonl"], "-i/--input", "ids.jsonl"),
    (["train", "-i", "{w}/ids.jsonl", "--vae", "{w}/vae.safetensors", "-o", "{t}/m.safetensors",
      "--checkpoint", "{w}/vae.safetensors"], "--vae", "vae.safetensors"),
    (["train", "-i", "{w}/ids.jsonl", "--vae", "{w}/vae.safetensors", "-o", "{t}/m.safetensors",
      "--checkpoint", "{t}/./m.safetensors"], "-o/--output", None),
    (["train", "-i", "{w}/ids.jsonl", "--vae", "{w}/vae.safetensors", "-o", "{t}/m.safetensors",
      "--log", "{w}/ids.jsonl"], "-i/--input", "ids.jsonl"),
    (["sample", "-m", "{w}/model.safetensors", "-o", "{w}/model.safetensors"], "-m/--model", "model.safetensors"),
    (["distill", "-i", "{w}/ids.jsonl", "-m", "{w}/model.safetensors", "-o", "{w}/model.safetensors"],
     "-m/--model", "model.safetensors"),
]


@pytest.mark.parametrize("args,other,kept", SAME, ids=[a[0] + " " + o for a, o, _ in SAME])
def test_the_same_file_as_input_and_output_is_refused(work, tmp_path, capsys, args, other, kept):
    args = [a.format(w=work, t=tmp_path) for a in args]
    before = (work / kept).read_bytes() if kept else None
    r = run_cli(args)
    one_line_error(r, 2, "is the same file as", other)
    if kept:
        assert (work / kept).read_bytes() == before
    assert not (tmp_path / "m.safetensors").exists()


def test_a_hard_link_is_the_same_file(work, tmp_path, capsys):
    link = tmp_path / "ids-link.jsonl"
    os.link(work / "ids.jsonl", link)
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", link])
    one_line_error(r, 2, "-o/--output", "-i/--input")


# ---------------------------------------------------------------- 12, 13: modes, symlinks, checks up front


def test_a_rewritten_file_keeps_its_mode(tmp_path, capsys, monkeypatch):
    out = tmp_path / "text.jsonl"
    out.write_text("old\n")
    os.chmod(out, 0o600)
    inp = tmp_path / "raw.txt"
    inp.write_text("床前明月光\n", encoding="utf-8")
    r = run_cli(["clean", "-i", inp, "-o", out, "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600 and "床前明月光" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize("kind", ["dangling", "loop"])
def test_a_symlink_that_leads_nowhere_is_refused(tmp_path, capsys, kind):
    link = tmp_path / "out.jsonl"
    if kind == "dangling":
        link.symlink_to(tmp_path / "missing" / "x.jsonl")
    else:
        (tmp_path / "b").symlink_to(link)
        link.symlink_to(tmp_path / "b")
    inp = tmp_path / "raw.txt"
    inp.write_text("abc\n")
    r = run_cli(["clean", "-i", inp, "-o", link, "--quiet"])
    one_line_error(r, 73, "-o/--output", "leads nowhere")
    assert link.is_symlink() and not (tmp_path / "missing").exists()


@pytest.mark.parametrize("log", ["/proc/tdiff-nope/log.jsonl", "{t}"])
def test_an_unwritable_log_is_refused_before_any_work(work, tmp_path, capsys, log):
    """--log in /proc or a directory: exit 73 before loading anything; -o's missing parent folders
    are not created by the refused command."""
    out = tmp_path / "new" / "deeper" / "m.safetensors"
    r = run_cli(_train_args(work, out, "--log", log.format(t=tmp_path)))
    one_line_error(r, 73, "--log")
    assert not (tmp_path / "new").exists()


def test_an_output_under_a_file_is_refused_creating_nothing(work, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    r = run_cli(_train_args(work, tmp_path / "afile" / "sub" / "m.safetensors"))
    one_line_error(r, 73, "-o/--output", "not a directory")
    assert (tmp_path / "afile").read_text() == "x"


# ---------------------------------------------------------------- 5, 14, 15, 16


def test_deeply_nested_json_with_an_escape_is_one_line(work, tmp_path, capsys):
    """~600 levels holding a lone surrogate escape: exit 65 naming file:line (no RecursionError);
    the library's lenient reading repairs it without recursion."""
    deep = '{"text": "abc", "x": ' + "[" * 600 + '"\\ud800"' + "]" * 600 + "}"
    f = tmp_path / "deep.jsonl"
    f.write_text('{"text": "ok"}\n' + deep + "\n")
    r = run_cli(["tokenize", "--tokenizer", work / "tok.model", "-i", f, "-o", tmp_path / "ids.jsonl"])
    one_line_error(r, 65, "deep.jsonl:2", "lone surrogate")
    assert not (tmp_path / "ids.jsonl").exists()
    from tdiff.core.errors import DataError
    from tdiff.files.streams import iter_jsonl

    with pytest.raises(DataError, match=r"deep.jsonl:2: a string holds a lone surrogate"):
        list(iter_jsonl(f))
    recs = [r for _, r in iter_jsonl(f, strict=False)]
    assert len(recs) == 2 and recs[1]["text"] == "abc"


def test_a_closed_stdout_is_one_line(tmp_path):
    """`tdiff clean >&-`: exit 74, one line (a real process: the closed descriptor is the point)."""
    r = subprocess.run([sys.executable, "-m", "tdiff", "clean"], input=b"abc\n", stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, cwd=ROOT, timeout=120, preexec_fn=lambda: os.close(1))
    assert r.returncode == 74, r.stderr.decode()
    assert r.stderr.decode().strip() == "tdiff: error: standard output is closed: <stdout>"


def test_a_yaml_boolean_is_not_a_number(work, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_steps: true\n")
    r = run_cli(_train_args(work, tmp_path / "m.safetensors")[:7] + ["--config", cfg])
    one_line_error(r, 2, "--max-steps", "true is a boolean, not a number")


@pytest.mark.parametrize("args,option", [(["sample", "-m", "{w}/model.safetensors", "--guidance", "nan"], "--guidance"),
                                         (["train", "-i", "{w}/ids.jsonl", "--vae", "{w}/vae.safetensors",
                                           "-o", "/dev/null", "--lr", "nan"], "--lr"),
                                         (["train", "-i", "{w}/ids.jsonl", "--vae", "{w}/vae.safetensors",
                                           "-o", "/dev/null", "--lr", "-inf"], "--lr")])
def test_nan_is_not_a_finite_number(work, capsys, args, option):
    r = run_cli([a.format(w=work) for a in args])
    one_line_error(r, 2, option, "is not a finite number")
