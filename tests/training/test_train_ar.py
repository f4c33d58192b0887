"""`tdiff train-ar` and tdiff.models.ar, tdiff.formats.ar_dir: the GPT-2 baseline / judge."""

from __future__ import annotations

import json
import math
import os

import pytest

from conftest import head_lines, run_cli, run_tdiff, shared_file

# The machine is small and shared: one thread trains a 2×64 model faster than two contending ones.
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
SIZE = ["--n-layers", "2", "--d-model", "64", "--n-heads", "2"]


def run_train_ar(args):
    return run_cli(["train-ar", *args])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny BPE tokenizer and ~3,300 short songci sentences as ids JSONL."""
    from tdiff.text.tokenizer_train import train

    d = tmp_path_factory.mktemp("ar")
    lines = head_lines(shared_file("songci.txt"), 400)
    sents = [s + "。" for line in lines for s in line.split("。") if s.strip()]
    tok = train(sents, d / "tok.model", vocab_size=2100, model_type="bpe", character_coverage=0.98)
    with open(d / "ids.jsonl", "w", encoding="utf-8") as f:
        for ids in tok.encode_batch(sents):
            f.write(json.dumps({"ids": ids}) + "\n")
    return d


@pytest.fixture(scope="module")
def trained(corpus):
    """40 steps, then --resume to 60: the output directory of the second run."""
    d = corpus
    common = ["-i", d / "ids.jsonl", "-t", d / "tok.model", "-o", d / "ar", *SIZE, "--batch-size", "32",
              "--warmup", "10", "--lr", "3e-3", "--log-every", "10", "--log", d / "metrics.jsonl",
              "--device", "cpu", "--seed", "1"]
    r1 = run_train_ar([*common, "--max-steps", "40"])
    assert r1.returncode == 0, r1.stderr.decode()
    assert (d / "ar.ckpt.safetensors").exists()
    r2 = run_train_ar([*common, "--max-steps", "60", "--resume"])
    assert r2.returncode == 0, r2.stderr.decode()
    return d, r1, r2


@pytest.mark.latest
def test_loss_falls_and_resume_continues(trained):
    d, r1, r2 = trained
    recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in recs]
    assert steps == [1, 10, 20, 30, 40, 50, 60]            # the resumed run went on from step 40
    assert "resumed from" in r2.stderr.decode() and "at step 40" in r2.stderr.decode()
    assert recs[-1]["loss"] < recs[0]["loss"] - 1.0
    assert all(r["tokens_per_s"] > 0 for r in recs)
    meta = json.loads((d / "ar" / "tdiff.json").read_text())
    assert meta["format"] == 1 and meta["kind"] == "ar"
    assert meta["train"]["steps"] == 60 and meta["train"]["seed"] == 1 and meta["train"]["data"]
    ppl = meta["train"]["heldout"]["perplexity"]
    assert 1 < ppl < math.exp(recs[0]["loss"])
    assert b"Traceback" not in r1.stderr + r2.stderr
    assert r1.stdout == r2.stdout == b""                   # stdout carries data only


@pytest.mark.latest
def test_directory_loads_offline_with_plain_transformers(trained, monkeypatch):
    d, _, _ = trained
    out = d / "ar"
    assert {"config.json", "model.safetensors", "generation_config.json", "tok.model", "tok.model.json",
            "tdiff.json"} <= {p.name for p in out.iterdir()}
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(out))       # plain transformers, no tdiff code
    c, g = m.config, m.generation_config
    assert type(m).__name__ == "GPT2LMHeadModel"
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id, c.vocab_size) == (1, 2, 3, 2100)
    assert (g.eos_token_id, g.pad_token_id) == (2, 3)


@pytest.mark.latest
def test_autotokenizer_and_pipeline_load_the_directory_offline(trained):
    """AutoTokenizer.from_pretrained(dir) gives tdiff's ids and texts (this tokenizer has no jieba
    pre-tokenization), and transformers.pipeline("text-generation", model=dir) runs offline in a
    process that never imports tdiff."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from tdiff.text.tokenizer import Tokenizer

    d, _, _ = trained
    out = d / "ar"
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
    fast = AutoTokenizer.from_pretrained(str(out))
    tok = Tokenizer.load(out / "tok.model")
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id, fast.unk_token_id) == \
        (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id)
    texts = [s for line in head_lines(shared_file("songci.txt"), 60, skip=400) for s in line.split("。") if s] + \
        ["Hello, world!  Two  spaces.", "混合 text 和 数字 123。"]
    for t in texts:
        ids = tok.encode(t)
        assert fast(t, add_special_tokens=False)["input_ids"] == ids, t
        assert fast.decode(ids) == tok.decode(ids), t
    code = ("import json, sys; sys.modules['tdiff'] = None; from transformers import pipeline; "
            f"p = pipeline('text-generation', model={str(out)!r}, device='cpu'); "
            "r = p('春风', max_new_tokens=5, do_sample=False); print(json.dumps(r, ensure_ascii=False))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300,
                       env={**os.environ, **ENV, "TRANSFORMERS_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    got = json.loads(r.stdout.decode().strip().splitlines()[-1])
    assert got[0]["generated_text"].startswith("春风") and len(got[0]["generated_text"]) > 2


@pytest.fixture(scope="module")
def judge(trained):
    from tdiff.formats.ar_dir import load_ar

    d, _, _ = trained
    model, tok = load_ar(d / "ar", "cpu")
    return d, model, tok


def test_generate_records_round_trip(judge):
    from tdiff.sampling.ar import generate_ar

    _, model, tok = judge
    kw = dict(num=5, batch_size=3, max_new_tokens=20, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    recs = list(generate_ar(model, tok, **kw))
    assert [r["index"] for r in recs] == [0, 1, 2, 3, 4]
    for r in recs:
        assert set(r) == {"text", "ids", "index", "seed"} and r["seed"] == 7
        assert 0 < len(r["ids"]) <= 20
        assert not {0, 1, 2, 3} & set(r["ids"])
        assert tok.decode(r["ids"]) == r["text"]
        assert tok.decode(tok.encode(r["text"])) == r["text"]
    again = list(generate_ar(model, tok, **kw))
    assert [r["ids"] for r in again] == [r["ids"] for r in recs]  # same seed, same output
    greedy = list(generate_ar(model, tok, num=2, batch_size=2, max_new_tokens=20, temperature=0))
    assert greedy[0]["ids"] == greedy[1]["ids"]


@pytest.mark.latest
def test_perplexity_is_exp_of_hf_loss(judge):
    import torch

    from tdiff.evaluation.perplexity import heldout_perplexity, judge_nll
    from tdiff.data import token_ids as D

    d, model, tok = judge
    _, held = D.split(D.read_ids(d / "ids.jsonl"), 0.02)
    seqs = held.seqs[:12]
    ppl, nll, n = heldout_perplexity(model, seqs, device="cpu", batch_size=5)
    assert n == sum(len(s) + 1 for s in seqs)              # the ids and each eos
    rows = [[1] + s + [2] for s in seqs]
    ids = D.pad_batch(rows, max(map(len, rows)), 3)
    mask = (ids != 3).long()
    with torch.no_grad():
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
    assert ppl == pytest.approx(math.exp(float(loss)), rel=1e-4)
    # the judge re-tokenizes text; text made by this tokenizer comes back as the same ids
    nll2, n2 = judge_nll(model, tok, [tok.decode(s) for s in seqs], device="cpu")
    assert n2 == n and nll2 == pytest.approx(nll, rel=1e-4)


def test_load_ar_refuses_other_things(tmp_path, trained):
    from tdiff.formats.ar_dir import is_ar_dir, load_ar
    from tdiff.core.errors import DataError, NoInputError, UsageError
    from tdiff.formats.ar_dir import check_ar_output

    d, _, _ = trained
    assert is_ar_dir(d / "ar") and not is_ar_dir(tmp_path) and not is_ar_dir(d / "tok.model")
    with pytest.raises(NoInputError):
        load_ar(tmp_path / "missing")
    with pytest.raises(DataError, match="tdiff.json"):
        (tmp_path / "config.json").write_text("{}")
        load_ar(tmp_path)
    with pytest.raises(DataError, match="not an AR model directory"):
        load_ar(d / "tok.model")
    with pytest.raises(UsageError):
        check_ar_output(tmp_path)                          # a non-empty directory of something else
    check_ar_output(d / "ar")                              # an earlier train-ar directory is replaced


def test_config_ids_and_sizes():
    pytest.importorskip("transformers")
    from tdiff.models.ar import make_config
    from tdiff.core.errors import UsageError
    from tdiff.training.train_ar import auto_max_len

    c = make_config(8000, 128, "base")
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (1, 2, 3)
    assert (c.n_layer, c.n_embd, c.n_head, c.n_positions) == (6, 512, 8, 128)
    c = make_config(8000, 64, "tiny", n_layer=2, n_embd=96, n_head=3)
    assert (c.n_layer, c.n_embd, c.n_head) == (2, 96, 3)
    with pytest.raises(UsageError):
        make_config(8000, 64, "tiny", n_embd=100, n_head=3)
    with pytest.raises(UsageError):
        make_config(8000, 64, "huge")
    assert auto_max_len([[5] * n for n in range(1, 101)]) == 102
    assert auto_max_len([[5] * 5000]) == 1024


def test_sample_command_reads_ar_directory(trained):
    """`tdiff sample -m DIR` samples an AR directory: records with text and ids, reproducible by seed."""
    d = trained[0]
    args = ["sample", "-m", d / "ar", "--num", "3", "--batch-size", "2", "--length", "12", "--seed", "5"]
    r1, r2 = run_tdiff(args, env=ENV), run_tdiff(args, env=ENV)
    assert r1.returncode == 0, r1.stderr.decode()
    recs = [json.loads(x) for x in r1.stdout.decode().splitlines()]
    assert len(recs) == 3 and all(r["solver"] == "ar" and len(r["ids"]) <= 12 for r in recs)
    again = [json.loads(x) for x in r2.stdout.decode().splitlines()]
    assert [(r["text"], r["ids"]) for r in recs] == [(r["text"], r["ids"]) for r in again]
    assert len({r["text"] for r in recs}) > 1      # temperature 1 by default: not the same greedy text
