"""`tdiff eval` and tdiff.evaluation (records, model_figures, sample_figures, speed, report): the eval-level aggregation on hand-computed inputs, and the CLI
end to end on tiny untrained models (plumbing, keys, exit codes; not quality: bench/ measures that).

The metric functions themselves are tested in test_metrics.py; here we check what eval reports.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import run_cli

ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
CPU = ["--device", "cpu", "--quiet"]

# A small deterministic "corpus": repeated phrases of a few dozen CJK characters.
_CHARS = "春花秋月何时了往事知多少小楼昨夜又东风故国不堪回首明中雕栏玉砌应犹在只是朱颜改问君能有几愁恰似一江水向流"


def _corpus(n=200):
    import random

    rng = random.Random(0)
    out = []
    for _ in range(n):
        k = rng.randint(4, 12)
        start = rng.randrange(len(_CHARS) - k)
        out.append(_CHARS[start:start + k] + "。")
    return out


def run_eval(args, **kw):
    return run_cli(["eval", *args], **kw)


def _json(r):
    assert r.returncode == 0, r.stderr.decode()
    assert b"Traceback" not in r.stderr
    assert r.stdout.count(b"\n") == 1                     # one JSON object on one line
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Tokenizer, ids, a VAE file, a model file (VAE + DiT) and an AR directory, all tiny and untrained."""
    import torch

    from tdiff.models.ar import build_model, make_config
    from tdiff.diffusion.schedules import make_schedule
    from tdiff.models.dit import DiT, DiTConfig
    from tdiff.models.vae import TextVAE, VAEConfig
    from tdiff.text.tokenizer_train import train
    from tdiff.files import artifacts as ck
    from tdiff.formats.ar_dir import save_ar

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("eval")
    texts = _corpus()
    tok = train(texts, d / "tok.model", vocab_size=320, model_type="bpe", character_coverage=1.0)
    ids = tok.encode_batch(texts)
    with open(d / "ids.jsonl", "w", encoding="utf-8") as f:
        for s in ids[:24]:
            f.write(json.dumps({"ids": s}) + "\n")
    with open(d / "text.jsonl", "w", encoding="utf-8") as f:
        for t, s in zip(texts, ids):
            f.write(json.dumps({"text": t, "ids": s}, ensure_ascii=False) + "\n")
    with open(d / "real.jsonl", "w", encoding="utf-8") as f:
        for t in texts[100:110]:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    with open(d / "samples.jsonl", "w", encoding="utf-8") as f:
        for t, s in zip(texts[:10], ids[:10]):
            f.write(json.dumps({"text": t, "ids": s}, ensure_ascii=False) + "\n")

    vcfg = VAEConfig(vocab_size=tok.vocab_size, max_len=16, d_model=32, n_layers=1, n_heads=2, latent_dim=8,
                     pad_id=tok.pad_id)
    vae = TextVAE(vcfg)
    vae_t = {f"vae.{k}": v for k, v in vae.state_dict().items()}
    ck.save_artifact(d / "vae.safetensors", vae_t, "vae", config={"vae": vcfg.to_dict()},
                     tokenizer=tok.to_bytes(), tokenizer_meta=tok.meta)
    dcfg = DiTConfig(latent_dim=8, max_len=16, d_model=32, n_layers=1, n_heads=2, time_freq_dim=32)
    dit = DiT(dcfg)
    sched = make_schedule("cosine")
    tensors = dict(vae_t)
    tensors.update({f"dit.{k}": v for k, v in dit.state_dict().items()})
    config = {"vae": vcfg.to_dict(), "dit": dcfg.to_dict(), "schedule": sched.config(),
              "diffusion": {"target": "v", "self_condition": True}}
    ck.save_artifact(d / "model.safetensors", tensors, "model", config=config,
                     tokenizer=tok.to_bytes(), tokenizer_meta=tok.meta)

    ar = build_model(make_config(tok.vocab_size, 32, n_layer=1, n_embd=32, n_head=2, dropout=0.0))
    save_ar(d / "ar", ar, tok, {})
    return d


# ---------------------------------------------------------------------------
# aggregation on hand-computed inputs


def test_sample_metrics_hand_computed():
    from tdiff.evaluation.sample_figures import sample_metrics
    # characters: a a b b → p = 1/2, 1/2 → H = ln 2; "ab", "ab" → self-BLEU 100 (identical)
    m = sample_metrics(["ab", "ab"])
    assert m["units"] == "chars" and m["count"] == 2
    assert m["unigram_entropy"] == pytest.approx(math.log(2))
    assert m["distinct_1"] == pytest.approx(2 / 4)       # {a, b} / 4 characters
    assert m["distinct_2"] == pytest.approx(1 / 2)       # {ab} / 2 bigrams
    assert m["distinct_3"] == 0.0                        # no trigrams
    assert m["repetition_rate"] == 0.0                   # repeats across samples do not count
    assert m["self_bleu"] == pytest.approx(100.0)
    assert m["length_chars"] == {"mean": 2.0, "p50": 2.0, "p95": 2.0, "min": 2.0, "max": 2.0}
    assert m["replacement_char_share"] == 0.0 and m["empty_share"] == 0.0
    assert "length_tokens" not in m

    # "abab": bigrams ab ba ab → one repeat of 3; uniform over 4 letters: H = ln 4
    m = sample_metrics(["abab", "cdcd\ufffd", ""], ids=[[1, 2], [3], []])
    assert m["repetition_rate"] == pytest.approx(2 / 7)  # abab: 1 of 3; cdcd�: 1 of 4
    assert m["replacement_char_share"] == pytest.approx(1 / 3)
    assert m["empty_share"] == pytest.approx(1 / 3)
    assert m["length_tokens"]["mean"] == pytest.approx(1.0)

    # disjoint samples share no n-grams: self-BLEU 0
    m = sample_metrics(["春花秋月", "往事知多"])
    assert m["self_bleu"] == pytest.approx(0.0, abs=1e-9)
    assert m["unigram_entropy"] == pytest.approx(math.log(8))


def test_sample_metrics_against_real_texts():
    from tdiff.evaluation.sample_figures import sample_metrics
    m = sample_metrics(["aaaa"], real_texts=["abab", "ab"])
    assert m["unigram_entropy"] == 0.0
    assert m["real"]["unigram_entropy"] == pytest.approx(math.log(2))
    assert m["entropy_ratio"] == 0.0
    assert m["length_ratio_real"] == pytest.approx(4 / 3)


def test_reference_metrics_pairing():
    from tdiff.evaluation.sample_figures import reference_metrics
    m = reference_metrics(["春花秋月", "往事知多少"], ["春花秋月", "小楼昨夜"])
    assert m["pairs"] == 2
    assert m["rouge_l"] == pytest.approx(0.5)            # (1 + 0) / 2
    assert m["length_ratio"] == pytest.approx(4.5 / 4)
    m = reference_metrics(["春花秋月何时了"] * 3, ["春花秋月何时了"])  # pairs the first min(N, M)
    assert m["pairs"] == 1 and m["bleu"] == pytest.approx(100.0) and m["rouge_l"] == pytest.approx(1.0)


def test_memorization_units(tmp_path):
    from tdiff.evaluation.records import TextRecords
    from tdiff.evaluation.sample_figures import memorization
    train = tmp_path / "train.jsonl"
    train.write_text('{"text": "abcdef", "ids": [1, 2, 3, 4, 5]}\n', encoding="utf-8")
    # characters: abcd, bcde in train; cdex not → 2 of 3 4-grams
    s = TextRecords("s", ["abcdex"], None)
    m = memorization(s, train)
    assert m["units"] == "chars" and m["ngram_overlap"] == pytest.approx(2 / 3) and m["n"] == 4
    # ids on both sides: [1 2 3 4] yes, [2 3 4 9] no
    s = TextRecords("s", ["zzzzz"], [[1, 2, 3, 4, 9]])
    m = memorization(s, train)
    assert m["units"] == "ids" and m["ngram_overlap"] == pytest.approx(1 / 2)


def test_judge_metrics_known_logits():
    """A fake judge with fixed next-token probabilities: PPL = exp(mean NLL) as hand-computed,
    and q from the three perplexities."""
    import torch

    from tdiff.evaluation.sample_figures import judge_metrics
    from tdiff.evaluation.metrics import perplexity_from_logits, ppl, q_position

    V = 8

    class Cfg:
        n_positions, bos_token_id, eos_token_id, pad_token_id, vocab_size = 64, 1, 2, 3, V

    class Judge(torch.nn.Module):
        config = Cfg()

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None, use_cache=False):
            # uniform over V, except token 2 (eos) after anything gets probability 1/2
            b, n = input_ids.shape
            logits = torch.zeros(b, n, V)
            logits[..., 2] = math.log((V - 1))               # p(eos) = (V-1)/(2(V-1)) = 1/2
            return type("Out", (), {"logits": logits})()

        def eval(self):
            return self

    class Tok:
        def encode_batch(self, texts):
            return [[4 + (ord(c) % 4) for c in t] for t in texts]

    p_other = 1 / (2 * (V - 1))
    # "ab": 2 characters + eos: NLL = 2·(-ln p_other) + ln 2, 3 tokens
    j = judge_metrics(Judge(), Tok(), ["ab"], real_texts=["abcd"], device="cpu")
    assert j["samples_tokens"] == 3
    assert j["samples_ppl"] == pytest.approx(math.exp((2 * -math.log(p_other) + math.log(2)) / 3))
    # cross-check against metrics.perplexity_from_logits on the same logits
    logits = torch.zeros(1, 3, V)
    logits[..., 2] = math.log(V - 1)
    nll, n = perplexity_from_logits(logits, torch.tensor([[4 + ord("a") % 4, 4 + ord("b") % 4, 2]]))
    assert j["samples_ppl"] == pytest.approx(ppl(nll, n))
    assert j["real_tokens"] == 5
    # shuffled characters of one text: same multiset, same judge NLL here (it ignores order)
    assert j["shuffled_ppl"] == pytest.approx(j["real_ppl"])
    assert j["q"] is None                                  # ln(shuffled/real) = 0: undefined
    assert q_position(4.0, 2.0, 8.0) == pytest.approx(0.5)


def test_speed_timing_summary():
    from tdiff.evaluation.speed import _timing
    t = _timing([1.0, 2.0, 3.0], positions_per_run=10, generated=12)
    assert t["tokens_per_s"] == pytest.approx(30 / 6)
    assert t["generated_tokens_per_s"] == pytest.approx(2.0)
    assert t["latency_p50_s"] == 2.0 and t["latency_p95_s"] == pytest.approx(2.9)


# ---------------------------------------------------------------------------
# the CLI


def test_model_data_reconstruction_and_denoising(work):
    args = ["-m", work / "model.safetensors", "--data", work / "ids.jsonl", "--t-samples", "2", *CPU]
    out = _json(run_eval(args))
    rec, den = out["reconstruction"], out["denoising"]
    assert 0 <= rec["token_accuracy"] <= 1 and 0 <= rec["exact_match"] <= 1
    assert rec["sequences"] == 24 and rec["max_len"] == 16
    assert den["loss"] > 0 and den["target"] == "v" and den["t_samples"] == 2
    assert _json(run_eval(args))["denoising"]["loss"] == den["loss"]          # fixed seed: same number
    out = _json(run_eval(["-m", work / "vae.safetensors", "--data", work / "ids.jsonl", "--max-records", "5", *CPU]))
    assert set(out) == {"reconstruction"} and out["reconstruction"]["sequences"] == 5


def test_noise_levels_table(work):
    """Per noise level: naive decode vs the denoiser's x0, on text positions. At a tiny t the noisy latent
    is the clean one, so the naive accuracy is the VAE's own accuracy on the text positions."""
    import torch

    from tdiff.formats.model import load_model
    from tdiff.data.token_ids import pad_batch, read_ids
    from tdiff.evaluation.model_figures import noise_levels
    dev = torch.device("cpu")
    bundle = load_model(work / "model.safetensors", dev)
    seqs = read_ids(work / "ids.jsonl").seqs
    out = noise_levels(bundle, seqs, dev, levels=(1e-4, 0.5, 0.9), seed=3)
    assert list(out["by_t"]) == ["0.0001", "0.5", "0.9"] and out["sequences"] == len(seqs)
    ids = pad_batch(seqs, bundle.vae.config.max_len, bundle.tokenizer.pad_id)
    text = ids != bundle.tokenizer.pad_id
    assert out["tokens"] == int(text.sum())
    with torch.no_grad():
        mu, _ = bundle.vae.encode(ids)
        own = float(((bundle.vae.decode(mu).argmax(-1) == ids) & text).sum()) / int(text.sum())
    row = out["by_t"]["0.0001"]
    assert row["naive_accuracy"] == pytest.approx(own, abs=0.02)
    for r in out["by_t"].values():
        assert 0 <= r["naive_accuracy"] <= 1 and 0 <= r["denoiser_accuracy"] <= 1 and r["loss"] > 0
        assert r["gain"] == pytest.approx(r["denoiser_accuracy"] - r["naive_accuracy"])
    assert out["by_t"]["0.5"]["log_snr"] == pytest.approx(0.0, abs=1e-9)      # cosine: λ(0.5) = 0
    assert noise_levels(bundle, seqs, dev, levels=(1e-4, 0.5, 0.9), seed=3) == out      # same seed, same numbers


def test_noise_levels_cli(work):
    args = ["-m", work / "model.safetensors", "--data", work / "ids.jsonl", "--t-samples", "1", *CPU]
    out = _json(run_eval(args + ["--noise-levels", "0.2,0.8"]))
    assert list(out["noise_levels"]["by_t"]) == ["0.2", "0.8"]
    assert "noise_levels" not in _json(run_eval(args + ["--noise-levels", "none"]))
    for bad in ("0.5,1", "x"):
        r = run_eval(args + ["--noise-levels", bad])
        assert r.returncode == 2 and b"--noise-levels" in r.stderr and b"Traceback" not in r.stderr


def test_ar_perplexity_and_speed(work):
    out = _json(run_eval(["-m", work / "ar", "--data", work / "ids.jsonl", "--speed", "--length", "6",
                          "--repeats", "3", "--warmup-batches", "1", "--batch-size", "2", *CPU]))
    p = out["perplexity"]
    assert p["perplexity"] > 1 and p["tokens"] > 0
    s = out["speed"]
    assert s["kind"] == "ar" and s["length"] == 6 and s["batch_size"] == 2
    assert s["tokens_per_s"] > 0 and s["latency_p50_s"] <= s["latency_p95_s"]
    assert s["generated_tokens_per_s"] == pytest.approx(s["tokens_per_s"])   # exactly --length new tokens


def test_diffusion_speed(work, tmp_path):
    o = tmp_path / "m.json"
    r = run_eval(["-m", work / "model.safetensors", "--speed", "--steps", "3", "--repeats", "3", "--warmup-batches", "1",
                  "--batch-size", "2", "-o", o, *CPU])
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == b""
    s = json.loads(o.read_text())["speed"]
    assert s["kind"] == "diffusion" and s["steps"] == 3 and s["solver"] == "dpm" and s["length"] == 16
    assert s["tokens_per_s"] > 0 and s["latency_p50_s"] <= s["latency_p95_s"]
    assert 0 <= s["generated_tokens_per_s"] <= s["tokens_per_s"]


def test_samples_judge_references_train(work):
    out = _json(run_eval(["--samples", work / "samples.jsonl", "--judge", work / "ar", "--references",
                          work / "samples.jsonl", "--real", work / "real.jsonl", "--train", work / "text.jsonl",
                          *CPU]))
    assert set(out) == {"samples", "judge", "memorization", "references"}
    s = out["samples"]
    assert s["units"] == "judge_tokens" and s["count"] == 10
    for k in ("unigram_entropy", "distinct_1", "distinct_2", "distinct_3", "repetition_rate", "self_bleu",
              "replacement_char_share"):
        assert isinstance(s[k], float), k
    assert {"mean", "p50", "p95"} <= set(s["length_chars"]) and "length_tokens" in s
    assert "real" in s and s["real"]["count"] == 10
    j = out["judge"]
    for k in ("samples_ppl", "real_ppl", "shuffled_ppl"):
        assert j[k] > 1, k
    assert j["q"] is None or isinstance(j["q"], float)
    m = out["memorization"]
    assert m["units"] == "ids" and m["ngram_overlap"] == pytest.approx(1.0)   # the samples are training texts
    ref = out["references"]
    assert ref["bleu"] == pytest.approx(100.0) and ref["rouge_l"] == pytest.approx(1.0)
    assert ref["length_ratio"] == pytest.approx(1.0)


def test_samples_without_judge_count_characters(work, tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text('{"text": "aabb"}\n{"text": "ab"}\n', encoding="utf-8")
    s = _json(run_eval(["--samples", p, "--quiet"]))["samples"]
    assert s["units"] == "chars" and s["unigram_entropy"] == pytest.approx(math.log(2))
    assert _json(run_eval(["--samples", "-", "--quiet"], input=p.read_text(encoding="utf-8")))["samples"] == s


def test_errors(work, tmp_path):
    r = run_eval(["--quiet"])
    assert r.returncode == 2 and b"--samples" in r.stderr and b"--data" in r.stderr and b"--speed" in r.stderr
    r = run_eval(["--data", work / "ids.jsonl", "--quiet"])
    assert r.returncode == 2 and b"--model" in r.stderr
    r = run_eval(["--samples", tmp_path / "nope.jsonl", "--quiet"])
    assert r.returncode == 66 and b"nope.jsonl" in r.stderr
    r = run_eval(["-m", tmp_path / "nope.safetensors", "--data", work / "ids.jsonl", *CPU])
    assert r.returncode == 66
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n', encoding="utf-8")
    r = run_eval(["--samples", bad, "--quiet"])
    assert r.returncode == 65 and b"bad.jsonl:2" in r.stderr
    notext = tmp_path / "notext.jsonl"
    notext.write_text('{"txt": "ok"}\n', encoding="utf-8")
    r = run_eval(["--samples", notext, "--quiet"])
    assert r.returncode == 65 and b"notext.jsonl:1" in r.stderr and b"'text'" in r.stderr
    vocab = tmp_path / "vocab.jsonl"
    vocab.write_text('{"ids": [5, 6]}\n{"ids": [1, 99999]}\n', encoding="utf-8")
    r = run_eval(["-m", work / "model.safetensors", "--data", vocab, *CPU])
    assert r.returncode == 65 and b"vocab.jsonl:2" in r.stderr and b"vocabulary" in r.stderr
    r = run_eval(["-m", work / "vae.safetensors", "--speed", *CPU])
    assert r.returncode == 2 and b"VAE" in r.stderr
    for res in (r,):
        assert b"Traceback" not in res.stderr


def test_dump_config(work):
    r = run_eval(["--samples", work / "samples.jsonl", "--steps", "4", "--dump-config"])
    assert r.returncode == 0
    import yaml

    d = yaml.safe_load(r.stdout)
    assert d["steps"] == 4 and d["samples"] == str(work / "samples.jsonl") and d["t_samples"] == 4
