"""The Python API: `tdiff.load(path)` on a diffusion model, a distilled student and a train-ar
directory; `sample`, `generate`, `encode`, `decode`, `config`; and `tdiff sample` as load + generate."""

from __future__ import annotations

import json

import pytest

import tdiff
from conftest import TINY, run_cli
from tdiff.core.errors import DataError, UsageError


@pytest.fixture(scope="module")
def artifacts(work, tmp_path_factory):
    """A distilled student (2 steps of distillation) and a train-ar directory (2 steps), beside `work`."""
    d = tmp_path_factory.mktemp("api")
    r = run_cli(["distill", "-i", work / "ids.jsonl", "-m", work / "model.safetensors", "-o", d / "st.safetensors",
                 "--from-steps", "8", "--to-steps", "4", "--max-steps", "2", "--batch-size", "8", "--device", "cpu",
                 "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", d / "ar", "--max-steps", "2",
                 "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    return {"model": work / "model.safetensors", "student": d / "st.safetensors", "ar": d / "ar"}


@pytest.mark.parametrize("kind", ["model", "student", "ar"])
def test_load_and_sample_each_kind(artifacts, kind):
    m = tdiff.load(artifacts[kind])
    assert m.kind == kind and isinstance(m.config, dict) and str(artifacts[kind]) in repr(m)
    texts = m.sample(n=2, steps=4) if kind != "ar" else m.sample(n=2, length=12)
    assert isinstance(texts, list) and len(texts) == 2 and all(isinstance(t, str) for t in texts)
    assert texts == (m.sample(n=2, steps=4) if kind != "ar" else m.sample(n=2, length=12))    # seeded
    if kind == "student":
        assert m.config["student"]["steps"] == 4 and m.plan()[:2] == (4, "ddim")


def test_generate_gives_the_records_tdiff_sample_writes(artifacts, tmp_path):
    """The CLI is load + generate + write: the same options give the same records, byte for byte."""
    out = tmp_path / "s.jsonl"
    r = run_cli(["sample", "-m", artifacts["model"], "-n", "3", "--batch-size", "2", "--steps", "3", "--seed", "7",
                 "--prompt", "春风", "--dtype", "fp32", "-o", out, "--device", "cpu", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    cli = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    m = tdiff.load(artifacts["model"])
    api = list(m.generate(3, batch_size=2, steps=3, seed=7, prompt="春风", dtype="fp32"))
    assert api == cli and len(api) == 3 and all(rec["text"].startswith("春风") for rec in api)
    assert m.sample(3, batch_size=2, steps=3, seed=7, prompt="春风", dtype="fp32") == [rec["text"] for rec in cli]


def test_requests_are_generated_n_times_each(artifacts):
    m = tdiff.load(artifacts["model"])
    reqs = [(1, {"prompt": "明月", "id": "a"}), (2, {"prompt": "清风", "id": "b"})]
    recs = list(m.generate(2, requests=iter(reqs), steps=2))
    assert [r["id"] for r in recs] == ["a", "a", "b", "b"] and all(r["text"].startswith(r["prompt"]) for r in recs)


def test_encode_then_decode_reads_the_latents_back(artifacts):
    m = tdiff.load(artifacts["model"])
    z = m.encode(["春风十里", "杨柳岸晓风残月"])
    assert tuple(z.shape) == (2, m.bundle.dit.config.max_len, m.bundle.dit.config.latent_dim)
    texts = m.decode(z)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    ar = tdiff.load(artifacts["ar"])
    ids = ar.encode(["春风十里"])
    assert ar.decode(ids) == [ar.tokenizer.decode(ids[0])] and all(isinstance(i, int) for i in ids[0])


@pytest.mark.parametrize("options,words", [
    ({"n": 0}, "n=0"), ({"steps": 0}, "steps=0"), ({"top_p": 1.5}, "top_p=1.5"),
    ({"temperature": float("nan")}, "temperature"), ({"batch_size": True}, "batch_size"),
    ({"solver": "euler"}, "--solver"), ({"prompt": "a[MASK]b"}, "control syntax"),
])
def test_bad_arguments_are_usage_errors(artifacts, options, words):
    m = tdiff.load(artifacts["model"])
    with pytest.raises(UsageError, match=words.replace("[", r"\[")):
        m.sample(**options)


def test_an_ar_model_refuses_what_only_diffusion_does(artifacts):
    ar = tdiff.load(artifacts["ar"])
    with pytest.raises(UsageError, match="--infill, --label: diffusion models only"):
        ar.sample(n=1, infill="a[MASK]b", label="pos")
    with pytest.raises(TypeError, match="no_such_option"):
        ar.sample(n=1, no_such_option=1)
    assert len(ar.sample(n=1, steps=5, solver="dpm", length=4)) == 1      # meaningless here: ignored


def test_load_refuses_what_is_not_a_model(work, tmp_path):
    with pytest.raises(DataError, match="a VAE file, not a diffusion model"):
        tdiff.load(work / "vae.safetensors")
    with pytest.raises(Exception, match="missing"):
        tdiff.load(tmp_path / "missing.safetensors")
