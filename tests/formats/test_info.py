"""`tdiff info`: one JSON object per artifact kind, from headers alone; bad paths are one-line errors."""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import one_line_error, run_cli


def info(path) -> dict:
    r = run_cli(["info", path])
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 1                                   # one JSON object, one line
    return json.loads(lines[0])


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_vae_and_model(work, capsys):
    from safetensors.torch import load_file

    m = info(work / "model.safetensors")
    tensors = load_file(str(work / "model.safetensors"))
    assert m["kind"] == "model" and m["sha256"] == sha(work / "model.safetensors")
    assert m["parameters_total"] == sum(t.numel() for t in tensors.values())
    assert m["parameters"]["dit"] == sum(t.numel() for k, t in tensors.items() if k.startswith("dit."))
    assert m["window"] == {"tokens": m["window"]["tokens"], "latents": [m["window"]["tokens"], 16]}
    assert m["schedule"] == "cosine" and m["diffusion"]["target"] == "v"
    assert m["tokenizer"]["vocab_size"] == 600
    t = m["training"]
    assert t["steps"] == 30 and t["seed"] == 0 and len(t["data"]) == 16 and t["minutes"] > 0
    assert t["tdiff_version"] == "0.1.0"
    v = info(work / "vae.safetensors")
    assert v["kind"] == "vae" and v["training"]["steps"] == 40 and set(v["parameters"]) == {"vae"}
    assert v["training"]["data"] == t["data"]                       # the same ids


def test_checkpoint_tokenizer_and_train_ar_dir(work, tmp_path, capsys):
    c = info(work / "model.ckpt.safetensors")
    assert c["kind"] == "checkpoint" and c["training"]["steps"] == 30 and "optim" in c["parameters"]
    t = info(work / "tok.model")
    assert t["kind"] == "tokenizer" and t["tokenizer"]["vocab_size"] == 600 and t["sha256"] == sha(work / "tok.model")
    r = run_cli(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp_path / "ar",
                        "--max-steps", "2", "--batch-size", "8", "--preset", "tiny", "--device", "cpu", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    a = info(tmp_path / "ar")
    assert a["kind"] == "ar" and a["model"]["model_type"] == "gpt2" and a["training"]["steps"] == 2
    assert a["sha256"] == sha(tmp_path / "ar" / "model.safetensors") and a["parameters_total"] > 0
    assert a["training"]["tdiff_version"] == "0.1.0" and "perplexity" in a["training"]["heldout"]


def test_export_dir(work, tmp_path, capsys):
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", tmp_path / "ex", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    e = info(tmp_path / "ex")
    assert e["kind"] == "export-dir" and "tdiff-manifest.json" in e["files"]
    assert all(e["files"][f] == sha(tmp_path / "ex" / f) for f in e["files"])


@pytest.mark.parametrize("what,code,words", [("missing", 66, ["does not exist"]),
                                             ("jsonl", 65, ["not a file tdiff writes"]),
                                             ("dir", 65, ["did not write"])])
def test_what_tdiff_did_not_write_is_one_line(work, tmp_path, capsys, what, code, words):
    path = {"missing": tmp_path / "nope", "jsonl": work / "ids.jsonl", "dir": tmp_path}[what]
    r = run_cli(["info", path])
    one_line_error(r, code, *words)
