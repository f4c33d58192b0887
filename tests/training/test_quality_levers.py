"""The quality levers of issue 9: adaptive timestep sampling, the decoder cross-entropy on the
x0 estimate, model-size options, decoder-input noise, and samples that are never empty."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch

from conftest import ROOT, TINY, run_cli, run_tdiff


from tdiff.diffusion.losses import decoder_cross_entropy, diffusion_loss
from tdiff.diffusion.schedules import make_schedule
from tdiff.diffusion.timewarp import TimeWarp


def test_timewarp_starts_uniform_and_is_a_distribution():
    w = TimeWarp(bins=16)
    p = w.density()
    assert torch.allclose(p, torch.full((16,), 1 / 16, dtype=torch.float64))
    t = w.sample(1000, torch.Generator().manual_seed(0), "cpu")
    assert t.dtype == torch.float64 and t.min() > 0 and t.max() < 1
    # stratified: exactly one sample in each of 1000 equal slices of [0, 1) under a uniform warp
    assert torch.equal(torch.sort((t * 1000).floor().long()).values, torch.arange(1000))


def test_timewarp_concentrates_where_the_error_rises():
    """An error that rises from 0 to 1 between t = 0.4 and 0.6: (1 - uniform) of the mass goes there,
    give or take the bin and a half on each side that the histogram of bin means and the 3-bin
    smoothing spread it over."""
    w = TimeWarp(bins=20, uniform=0.2)
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        t = torch.rand(256, generator=g, dtype=torch.float64)
        err = ((t - 0.4) / 0.2).clamp(0, 1)
        w.update(t, err)
    p = w.density()
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-9)
    inside = float(p[6:14].sum())                              # bins covering [0.3, 0.7)
    assert inside == pytest.approx(0.8 + 0.2 * 8 / 20, abs=0.01)
    assert float(p[:5].max()) == pytest.approx(0.2 / 20) and float(p[15:].max()) == pytest.approx(0.2 / 20)
    t = w.sample(4000, g, "cpu")
    share = float(((t >= 0.3) & (t < 0.7)).double().mean())
    assert share == pytest.approx(inside, abs=0.01)
    lv = torch.linspace(0, 1, 11, dtype=torch.float64)
    inv = w.inverse(lv)
    assert float(inv[0]) == 0 and float(inv[-1]) == pytest.approx(1) and bool((inv.diff() >= 0).all())


def test_timewarp_rejects_bad_settings():
    for kw in ({"bins": 1}, {"uniform": 0.0}, {"momentum": 1.0}):
        with pytest.raises(ValueError):
            TimeWarp(**kw)


def test_decoder_cross_entropy_counts_text_and_first_pad_at_unknown_positions():
    V, pad = 7, 3
    ids = torch.tensor([[5, 6, pad, pad], [1, 2, 4, 5]])                 # (B, L)
    onehot = torch.nn.functional.one_hot(ids, V).float() * 20           # a perfect decoder

    def decode(z):                                                      # z (B, N, D) → logits (B, L, V)
        return onehot + 0 * z.sum()

    z = torch.zeros(2, 4, 2, requires_grad=True)
    unknown = torch.ones(2, 4, 1)
    ce = decoder_cross_entropy(decode, z, ids, unknown, pad)
    assert ce.shape == (2,) and float(ce.detach().max()) < 1e-6
    wrong = decoder_cross_entropy(lambda z: torch.zeros(2, 4, V) + 0 * z.sum(), z, ids, unknown, pad)
    assert torch.allclose(wrong, torch.full((2,), math.log(V)))
    # nothing counted where every position is known
    assert float(decoder_cross_entropy(decode, z, ids, torch.zeros(2, 4, 1), pad).detach().abs().sum()) == 0
    # stride 2: one latent per two tokens; the mask is spread over both
    half = decoder_cross_entropy(lambda z: torch.zeros(2, 4, V) + 0 * z.sum(), torch.zeros(2, 2, 2), ids,
                                 torch.tensor([[[1.0], [0.0]], [[0.0], [1.0]]]), pad)
    assert torch.allclose(half, torch.full((2,), math.log(V)))


def test_x0_grad_keeps_the_graph_and_x0_error_is_reported():
    from tdiff.models.dit import DiT, DiTConfig

    torch.manual_seed(0)
    dit = DiT(DiTConfig(latent_dim=4, max_len=6, d_model=32, n_layers=1, n_heads=2))
    x0 = torch.randn(3, 6, 4)
    g = torch.Generator().manual_seed(0)
    terms = diffusion_loss(dit, make_schedule("cosine"), x0, target="v", generator=g, estimates=True, x0_grad=True)
    assert terms.x0_hat.requires_grad and terms.x0_error.shape == (3,) and terms.unknown.shape == (3, 6, 1)
    terms.x0_hat.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in dit.parameters())
    g = torch.Generator().manual_seed(0)
    plain = diffusion_loss(dit, make_schedule("cosine"), x0, target="v", generator=g, estimates=True)
    assert not plain.x0_hat.requires_grad
    assert torch.allclose(plain.x0_error, terms.x0_error)


def test_train_with_adaptive_t_decoder_ce_and_size(work, tmp_path):
    out, log = tmp_path / "m.safetensors", tmp_path / "l.jsonl"
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", out,
                   "--t-sampling", "adaptive", "--decoder-ce", "0.5", "--d-model", "64", "--n-layers", "2",
                   "--max-steps", "8", "--batch-size", "8", "--log", log, "--log-every", "1", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert all({"mse", "decoder_ce", "x0_error"} <= set(rec) for rec in recs)
    assert all(rec["loss"] == rec["mse"] for rec in recs)                # the logged loss stays the MSE
    from tdiff.files.artifacts import load_artifact
    from tdiff.formats.model import load_model

    art = load_artifact(out)
    assert art.config["dit"]["d_model"] == 64 and art.config["dit"]["n_layers"] == 2
    assert art.config["timewarp"]["bins"] == 64 and "timewarp.curve" in art.tensors
    assert 8 <= float(art.tensors["timewarp.count"].sum()) <= 8 * 8     # bin updates: ≥ 1 per step, ≤ 1 per example
    assert art.train["config"]["t_sampling"] == "adaptive" and art.train["config"]["decoder_ce"] == 0.5
    b = load_model(out)
    assert b.dit.config.d_model == 64
    r = run_cli(["sample", "-m", out, "--num", "3", "--steps", "2", "--device", "cpu"])
    assert r.returncode == 0 and len(r.stdout.decode().splitlines()) == 3


@pytest.mark.parametrize("args", [["--t-sampling", "sometimes"], ["--decoder-ce", "-1"], ["--d-model", "-8"],
                                  ["--d-model", "30"], ["--n-layers", "-1"]])
def test_bad_lever_options_exit_2(work, tmp_path, args):
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", tmp_path / "m",
                   "--max-steps", "1", *args, *TINY])
    assert r.returncode == 2, r.stderr.decode()
    assert b"Traceback" not in r.stderr


def test_train_vae_size_and_latent_noise(work, tmp_path):
    out = tmp_path / "v.safetensors"
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, "--d-model", "64",
                   "--n-layers", "1", "--latent-noise", "0.3", "--latent-dim", "8", "--max-steps", "3",
                   "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    from tdiff.files.artifacts import load_artifact

    cfg = load_artifact(out).config["vae"]
    assert (cfg["d_model"], cfg["n_layers"], cfg["latent_noise"], cfg["latent_dim"]) == (64, 1, 0.3, 8)
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out,
                   "--latent-noise", "-0.1", *TINY])
    assert r.returncode == 2 and b"--latent-noise" in r.stderr


def test_samples_are_never_empty(work):
    """Latents of an all-pad sequence decode to pads; the first position is still a text token."""
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import SampleOptions, latents_to_ids

    b = load_model(work / "model.safetensors")
    tok, vae = b.tokenizer, b.vae
    ids = torch.full((2, vae.config.max_len), tok.pad_id)
    with torch.no_grad():
        z = vae.normalize(vae.encode(ids)[0])                               # (2, N, C)
        plain = vae.decode(vae.denormalize(z)).argmax(-1)
    assert int(plain[0, 0]) == tok.pad_id                                   # what used to become ""
    out = latents_to_ids(b, z, SampleOptions(), torch.Generator().manual_seed(0))
    assert int(out[0, 0]) not in (tok.pad_id, tok.bos_id, tok.eos_id)


def test_frontier_interpolates_at_the_real_entropy():
    from bench.quality.frontier import at_entropy

    pts = [{"char_entropy": 5.0, "judge_ppl": 100.0}, {"char_entropy": 6.0, "judge_ppl": 400.0},
           {"char_entropy": 7.0, "judge_ppl": 1600.0}]
    assert at_entropy(pts, 5.5) == pytest.approx(200.0)                   # ln-linear: geometric midpoint
    assert at_entropy(pts, 6.0) == pytest.approx(400.0)
    assert at_entropy(list(reversed(pts)), 6.5) == pytest.approx(800.0)
    assert at_entropy(pts, 7.5) is None and at_entropy(pts, 4.0) is None


def test_time_grid_warp_and_round_x0(work, tmp_path):
    out = tmp_path / "w.safetensors"
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", out,
                   "--t-sampling", "adaptive", "--max-steps", "4", "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    from tdiff.formats.model import load_model
    from tdiff.diffusion.solvers import time_grid

    b = load_model(out)
    ts = time_grid(12, b.schedule, "warp", warp=b.timewarp)
    assert ts.shape == (13,) and float(ts[0]) == 1 and float(ts[-1]) == 0 and bool((ts.diff() < 0).all())
    for extra in (["--time-grid", "warp"], ["--round-x0"], ["--time-grid", "logsnr", "--round-x0"]):
        r = run_cli(["sample", "-m", out, "--num", "2", "--steps", "3", "--device", "cpu", *extra])
        assert r.returncode == 0, r.stderr.decode()
        assert len(r.stdout.decode().splitlines()) == 2
    # a model trained with uniform t has no time warp: a clear usage error
    uni = tmp_path / "u.safetensors"
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", uni,
                   "--t-sampling", "uniform", "--max-steps", "1", "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["sample", "-m", uni, "--time-grid", "warp", "--device", "cpu"])
    assert r.returncode == 2 and b"--t-sampling adaptive" in r.stderr and b"Traceback" not in r.stderr


def test_round_x0_keeps_the_latents_of_text_the_vae_reconstructs(work):
    """Rounding snaps latents to the latents of the tokens they decode to, so the latents of real
    text that the VAE reconstructs are a fixed point, and rounding twice decodes as rounding once."""
    from tdiff.formats.model import load_model
    from tdiff.data.token_ids import pad_batch, read_ids

    b = load_model(work / "model.safetensors")
    seqs = read_ids(work / "ids.jsonl").seqs[:64]
    # short texts (1-3 tokens): the tests' 40-step VAE reconstructs many of them whole, few long ones
    ids = pad_batch([s[:1 + i % 3] for i, s in enumerate(seqs)], b.vae.config.max_len, b.tokenizer.pad_id)  # (B, L)
    dec = lambda x: b.vae.decode(b.vae.denormalize(x)).argmax(-1)  # noqa: E731
    with torch.no_grad():
        z = b.vae.normalize(b.vae.encode(ids)[0])                                   # (B, N, D)
        ok = (dec(z) == ids).all(-1)                                                # (B,) reconstructed rows
        once = b.round_x0(z)
        twice = b.round_x0(once)
    assert ok.sum() >= 1
    assert torch.allclose(once[ok], z[ok], atol=1e-5)
    assert torch.equal(dec(once)[ok], dec(twice)[ok])


def test_train_vae_align_to_a_frozen_lm(work, tmp_path):
    lm, log = tmp_path / "lm", tmp_path / "v.jsonl"
    r = run_cli(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", lm, "--n-layers", "2",
                   "--d-model", "32", "--n-heads", "2", "--max-steps", "2", "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    out = tmp_path / "v.safetensors"
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, "--align", lm,
                   "--align-weight", "1.0", "--max-steps", "4", "--batch-size", "8", "--log", log,
                   "--log-every", "1", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(-1 <= rec["align_cos"] <= 1 for rec in recs) and len(recs) == 4
    from tdiff.files.artifacts import load_artifact

    art = load_artifact(out)
    assert not any(k.startswith(("probe", "vae.probe", "vae.vae")) for k in art.tensors)
    assert art.train["config"]["align"] == str(lm)
    r = run_cli(["sample", "-m", work / "model.safetensors", "--num", "1", "--device", "cpu"])
    assert r.returncode == 0
    # a language model over another tokenizer is refused before training starts
    other = tmp_path / "other.model"
    r = run_cli(["tokenize", "--tokenizer", other, "--vocab-size", "300", "-i", work / "text.jsonl", "-o",
                   tmp_path / "o.jsonl", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", other, "-o", tmp_path / "x.safetensors",
                   "--align", lm, "--max-steps", "1", *TINY])
    assert r.returncode in (2, 65), r.stderr.decode()                     # ids outside it, or its LM refused
    assert b"Traceback" not in r.stderr
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp_path / "x.safetensors",
                   "--align", tmp_path / "missing", "--max-steps", "1", *TINY])
    assert r.returncode == 66, r.stderr.decode()


@pytest.mark.slow
def test_train_vae_with_a_frozen_pretrained_encoder(work, tmp_path):
    """--encoder DIR: the LM's first half is copied into the VAE, never updated; the VAE trains,
    saves self-contained, and a DiT trains and samples on it."""
    import torch

    from tdiff.formats.ar_dir import load_ar
    from tdiff.files.artifacts import load_artifact

    lm = tmp_path / "lm"
    r = run_cli(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", lm, "--n-layers", "2",
                   "--d-model", "32", "--n-heads", "2", "--max-len", "513", "--max-steps", "2", "--batch-size", "8",
                   *TINY])
    assert r.returncode == 0, r.stderr.decode()
    vae, log = tmp_path / "v.safetensors", tmp_path / "v.jsonl"
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", vae, "--encoder", lm,
                   "--max-steps", "6", "--batch-size", "8", "--log", log, "--log-every", "1", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    assert recs[-1]["rec"] < recs[0]["rec"]                                   # it learns
    art = load_artifact(vae)
    assert art.config["vae"]["encoder_lm"]["n_layer"] == 1                    # cut after the middle block
    assert "vae.tok_emb.weight" not in art.tensors
    ref = load_ar(lm)[0].transformer.state_dict()
    for k in ("wte.weight", "h.0.attn.c_attn.weight"):                       # frozen: bit-identical to the LM
        assert torch.equal(art.tensors[f"vae.encoder_lm.{k}"], ref[k].to(art.tensors[f"vae.encoder_lm.{k}"].dtype))
    assert not any(k.startswith("vae.encoder_lm.h.1.") for k in art.tensors)
    model = tmp_path / "m.safetensors"
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", vae, "-o", model, "--max-steps", "2",
                   "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["sample", "-m", model, "--num", "2", "--steps", "2", "--device", "cpu"])
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr.decode()
    # an LM that cannot read the VAE's positions is refused before training, naming the option
    short = tmp_path / "short"
    r = run_cli(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", short, "--n-layers", "1",
                   "--d-model", "32", "--n-heads", "2", "--max-len", "8", "--max-steps", "1", "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp_path / "x.safetensors",
                   "--encoder", short, "--max-steps", "1", *TINY])
    assert r.returncode == 2 and b"--encoder" in r.stderr and b"Traceback" not in r.stderr, r.stderr.decode()


def test_text_ends_where_the_pads_begin_and_stray_pads_are_dropped():
    from types import SimpleNamespace

    from tdiff.sampling.sample import trim_ids

    tok = SimpleNamespace(pad_id=3, bos_id=1, eos_id=2)
    assert trim_ids([5, 3, 6, 7, 3, 3, 8, 3, 3, 3, 9], tok) == [5, 6, 7, 8]
    assert trim_ids([5, 6, 3, 3, 3, 3], tok) == [5, 6]
    assert trim_ids([1, 5, 2, 6], tok) == [5, 6]                          # no pads: the whole row
    assert trim_ids([3, 3, 3, 5], tok) == []
    assert trim_ids([5, 3, 6, 3, 3, 7], tok, end_run=2) == [5, 6]


@pytest.mark.slow
def test_frontier_bench_end_to_end(work, tmp_path):
    """bench.quality.frontier on a tiny model and a tiny AR model: JSON with every point, the
    interpolated figure (or null), empties counted, seeds summarized."""
    import subprocess

    lm = tmp_path / "lm"
    r = run_tdiff(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", lm, "--n-layers", "1",
                   "--d-model", "32", "--n-heads", "2", "--max-steps", "2", "--batch-size", "8", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    p = subprocess.run([sys.executable, "-m", "bench.quality.frontier", "--judge", str(lm), "--real",
                        str(work / "text.jsonl"), "--system", f"td={work / 'model.safetensors'}",
                        "--system", f"td={work / 'model.safetensors'}", "--system", f"ar={lm}", "--num", "6",
                        "--tdiff-knobs", "0,1.0", "--ar-knobs", "0.5,1.5", "--steps", "2"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [r["system"] for r in out["runs"]] == ["td", "td", "ar"]
    for run in out["runs"]:
        assert len(run["points"]) == 2
        for pt in run["points"]:
            assert pt["judge_ppl"] > 0 and pt["empty"] >= 0 and pt["replacement_char"] >= 0
    assert out["summary"]["td"]["ppl_at_real_entropy"]["n"] in (0, 2)
    strip = lambda pts: [{k: v for k, v in p.items() if k != "sample_s"} for p in pts]  # noqa: E731
    assert strip(out["runs"][0]["points"]) == strip(out["runs"][1]["points"])   # same model and seed: same figures
