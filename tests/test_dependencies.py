"""What a fresh install gets, and whether it runs: the lock pins what CI tests, every import the
code needs at run time is a declared dependency (every subcommand runs in an environment of the
core dependencies alone), and train-ar's directory loads with transformers' Auto classes there.

The tests marked `latest` are the smoke subset `make test-latest` runs on the newest releases."""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from core_env import _name, closure, declared, make_core_env

EXTRAS_CI = ("dev", "onnx", "plot")          # what `make install` installs


def _lock() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: '{line}' is not an exact pin"
            out[_name(name)] = version
    return out


def _extra_requirements(extras) -> list[str]:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        opt = tomllib.load(f)["project"]["optional-dependencies"]
    return [r for e in extras for r in opt[e]]


def test_the_lock_pins_everything_make_install_installs():
    """Every distribution that the core dependencies and CI's extras need, transitively, has an exact
    version in constraints.txt, and the lock's torch is the CPU build make install takes."""
    lock = _lock()
    need = closure(declared() + _extra_requirements(EXTRAS_CI))
    missing = sorted(set(need) - set(lock))
    assert not missing, f"not pinned in constraints.txt: {missing} (run make lock)"
    assert lock["torch"] == "2.13.0"
    makefile = (ROOT / "Makefile").read_text()
    assert "-c $(VENV)/constraints.txt -e '.[dev,onnx,plot]'" in makefile
    assert "make install" in (ROOT / ".ci" / "run").read_text()


def _third_party_imports() -> dict[str, list[str]]:
    """Top-level names of every module imported anywhere in tdiff/, outside the standard library and
    tdiff itself, with the files that import them."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tdiff").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            for n in names:
                top = n.split(".")[0]
                if top != "tdiff" and top not in sys.stdlib_module_names:
                    found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


# Imported only behind a clear "install the extra" error (tests check each message elsewhere).
OPTIONAL_IMPORTS = {"matplotlib": "plot", "onnx": "onnx", "onnxscript": "onnx", "onnxruntime": "onnx",
                    "snownlp": "eval --classifier snownlp (demo/dev extra)"}


def test_every_import_is_a_declared_dependency():
    dists = md.packages_distributions()
    core = set(closure(declared()))
    undeclared = {}
    for top, files in _third_party_imports().items():
        if top in OPTIONAL_IMPORTS:
            continue
        owners = {_name(d) for d in dists.get(top, [])}
        if not owners & core:
            undeclared[top] = sorted(set(files))
    assert not undeclared, f"imported but not a (transitive) core dependency: {undeclared}"


@pytest.fixture(scope="module")
def core_python(tmp_path_factory):
    return make_core_env(tmp_path_factory.mktemp("core") / "venv")


def _run(py, args, cwd, timeout=600, **kw):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONUTF8"] = "1"
    r = subprocess.run([str(py), *map(str, args)], capture_output=True, cwd=cwd, timeout=timeout, env=env, **kw)
    return r


def test_the_core_environment_lacks_the_extras(core_python, tmp_path):
    """The environment is what it claims: the core dependencies (protobuf among them), no extras, no pytest."""
    r = _run(core_python, ["-c", "import importlib.util as u; print([m for m in ('matplotlib', 'onnx', 'snownlp', "
                                 "'pytest', 'google.protobuf', 'tdiff') if u.find_spec(m.split('.')[0]) is not None])"],
             tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(r.stdout.decode().replace("'", '"')) == ["google.protobuf", "tdiff"]


@pytest.mark.latest
@pytest.mark.slow
def test_every_subcommand_runs_on_the_core_dependencies(core_python, work, tmp_path):
    """The whole pipeline, each subcommand as a user runs it, in a venv of the declared core
    dependencies only; train-ar's directory then loads with AutoTokenizer / AutoModelForCausalLM there."""
    w, t = work, tmp_path
    tiny = ["--preset", "tiny", "--device", "cpu", "--quiet", "--batch-size", "8", "--max-steps", "2"]
    steps = [
        ["clean", "--max-chars", "40", "-i", t / "raw.txt", "-o", t / "text.jsonl", "--quiet"],
        ["tokenize", "--tokenizer", t / "tok.model", "--vocab-size", "300", "-i", t / "text.jsonl",
         "-o", t / "ids.jsonl", "--quiet"],
        ["tokenize", "--decode", "--tokenizer", t / "tok.model", "-i", t / "ids.jsonl", "-o", t / "back.jsonl"],
        ["train-vae", "-i", t / "ids.jsonl", "-t", t / "tok.model", "-o", t / "vae.safetensors", "--latent-dim", "8", *tiny],
        ["train", "-i", t / "ids.jsonl", "--vae", t / "vae.safetensors", "-o", t / "model.safetensors", *tiny],
        ["sample", "-m", t / "model.safetensors", "--num", "2", "--steps", "2", "-o", t / "samples.jsonl", "--quiet"],
        ["distill", "-i", t / "ids.jsonl", "-m", t / "model.safetensors", "-o", t / "student.safetensors",
         "--from-steps", "4", "--to-steps", "2", "--device", "cpu", "--quiet", "--batch-size", "8", "--max-steps", "1"],
        ["train-ar", "-i", t / "ids.jsonl", "-t", t / "tok.model", "-o", t / "ar", *tiny],
        ["eval", "-m", t / "model.safetensors", "--data", t / "few.jsonl", "--samples", t / "samples.jsonl",
         "--judge", t / "ar", "--device", "cpu", "--quiet", "-o", t / "metrics.json"],
        ["export", "-m", t / "model.safetensors", "-o", t / "export", "--format", "torchscript", "--quiet"],
    ]
    (t / "raw.txt").write_text((w / "raw.txt").read_text(encoding="utf-8"), encoding="utf-8")
    for args in steps:
        if args[0] == "eval":
            (t / "few.jsonl").write_text("".join((t / "ids.jsonl").read_text().splitlines(True)[:16]))
        r = _run(core_python, ["-m", "tdiff", *args], t)
        assert r.returncode == 0, f"tdiff {args[0]}: exit {r.returncode}: {r.stderr.decode()[-2000:]}"
    # the extras' commands fail with their one-line hint, not an ImportError traceback
    (t / "log.jsonl").write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.0}\n')
    r = _run(core_python, ["-m", "tdiff", "plot", t / "log.jsonl", "-o", t / "p.png"], t)
    assert r.returncode == 2 and b"tdiff[plot]" in r.stderr and b"Traceback" not in r.stderr, r.stderr.decode()
    r = _run(core_python, ["-m", "tdiff", "export", "-m", t / "model.safetensors", "-o", t / "onnx", "--format", "onnx"], t)
    assert r.returncode == 2 and b"onnx" in r.stderr and b"Traceback" not in r.stderr, r.stderr.decode()
    # the train-ar directory with transformers alone, in a process that never imports tdiff
    code = ("import sys; from transformers import AutoTokenizer, AutoModelForCausalLM; d = sys.argv[1]; "
            "t = AutoTokenizer.from_pretrained(d); m = AutoModelForCausalLM.from_pretrained(d); "
            "ids = t('春风', return_tensors='pt').input_ids; out = m.generate(ids, max_new_tokens=3, do_sample=False); "
            "print(len(t.decode(out[0])) > 0, type(m).__name__)")
    r = _run(core_python, ["-c", code, t / "ar"], t)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout.decode().split() == ["True", "GPT2LMHeadModel"]
