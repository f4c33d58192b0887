"""The contextual (autoregressive, CoDAR) VAE decoder: `tdiff train-vae --decoder contextual`.

One tiny contextual VAE is trained through the CLI (in process) for the whole module; the decoding
tests run its `decode_tokens` against a no-cache reference, the end-to-end test trains a denoiser on it
and samples, and the parallel VAE of the session's `work` fixture checks that old files still load.
"""

import json

import pytest
import torch

from conftest import one_line_error, run_cli

SMALL = ["--preset", "tiny", "--d-model", "64", "--n-layers", "1", "--latent-dim", "16", "--device", "cpu"]


@pytest.fixture(scope="module")
def ctx(work, tmp_path_factory):
    """A directory with a contextual VAE (cvae.safetensors, trained 60 steps) and its metrics log."""
    tmp = tmp_path_factory.mktemp("ctx")
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp / "cvae.safetensors",
                 "--decoder", "contextual", "--ctx-layers", "1", "--max-steps", "60", "--batch-size", "8",
                 "--lr", "3e-3", "--log", tmp / "log.jsonl", "--log-every", "5", "--quiet", *SMALL])
    assert r.returncode == 0, r.stderr.decode()
    return tmp


@pytest.fixture(scope="module")
def loaded(ctx, work):
    """(contextual VAE in eval mode, tokenizer, a batch of the training ids (8, 32))."""
    from tdiff.data.token_ids import pad_batch
    from tdiff.formats.model import load_vae

    vae, tok, _ = load_vae(ctx / "cvae.safetensors")
    seqs = [json.loads(line)["ids"] for line in (work / "ids.jsonl").read_text().splitlines()[:8]]
    return vae, tok, pad_batch(seqs, vae.config.max_len, tok.pad_id)


def _noisy_latents(vae, ids, scale=0.3, seed=0):
    """Posterior means of IDS (B, L) with Gaussian noise at SCALE of each channel's std: latents like
    a denoiser's, not exactly any text's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        mean, _ = vae.encode(ids)                                                   # (B, N, C)
    return mean + scale * vae.latent_std * torch.randn(mean.shape, generator=g)


def _reference_greedy(vae, z, known_ids=None, known_mask=None, text=False):
    """Greedy decoding without a cache: the whole causal forward (`ctx_hidden`) re-run every step.
    TEXT: pad and bos banned everywhere (rows run to the end)."""
    c = vae.config
    with torch.no_grad():
        memory = vae.decode_hidden(z)                                               # (B, L, D)
        B, L, _ = memory.shape
        ids = torch.full((B, L), c.pad_id)
        done = torch.zeros(B, dtype=torch.bool)
        for i in range(L):
            prev = torch.cat([torch.full((B, 1), c.bos_id), ids[:, :i]], dim=1)     # (B, i + 1)
            logits = vae.lm_head(vae.ctx_hidden(prev, memory))[:, -1]              # (B, V)
            if text:
                logits[:, [c.pad_id, c.bos_id]] = float("-inf")
            tok = logits.argmax(-1)                                                 # (B,)
            tok = torch.where(done, c.pad_id, tok)
            if known_mask is not None:
                tok = torch.where(known_mask[:, i], known_ids[:, i], tok)
            ids[:, i] = tok
            done |= tok == c.pad_id
    return ids


def test_training_lowers_the_contextual_ce_and_info_shows_the_decoder(ctx):
    rows = [json.loads(line) for line in (ctx / "log.jsonl").read_text().splitlines()]
    ce = [row["ctx_rec"] for row in rows if "ctx_rec" in row]
    assert len(ce) >= 10 and ce[-1] < ce[0] - 1.0, ce                # nats: well below where it started
    assert all("ctx_acc" in row and "acc" in row for row in rows if "ctx_rec" in row)
    r = run_cli(["info", ctx / "cvae.safetensors"])
    assert r.returncode == 0, r.stderr.decode()
    info = json.loads(r.stdout)
    assert info["decoder"] == {"kind": "contextual", "ctx_layers": 1}
    assert info["training"]["config"]["decoder"] == "contextual"


def test_cached_decoding_equals_the_no_cache_reference(loaded):
    vae, tok, ids = loaded
    z = _noisy_latents(vae, ids)
    got = vae.decode_tokens(z)
    assert torch.equal(got, _reference_greedy(vae, z))
    assert int((got != tok.pad_id).sum(1).max()) >= 5                 # real texts, not an immediate stop
    # known tokens are forced into the context: the reference feeds them as inputs too
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(ids.shape, generator=g) < 0.3                      # (B, L)
    known = torch.randint(4, tok.vocab_size, ids.shape, generator=g)     # (B, L)
    got = vae.decode_tokens(z, known_ids=known, known_mask=mask)
    assert torch.equal(got, _reference_greedy(vae, z, known, mask))
    assert torch.equal(got[mask], known[mask])


def test_cached_decoding_equals_the_reference_on_a_sharp_random_decoder():
    """Two blocks with weights large enough that every attention is far from uniform, rows that never
    stop: a cache that drops the past or a position offset lost on the way shows here."""
    from tdiff.models.vae import TextVAE, VAEConfig

    torch.manual_seed(0)
    vae = TextVAE(VAEConfig(vocab_size=50, max_len=24, d_model=32, n_heads=2, n_layers=1, latent_dim=8,
                            decoder="contextual", ctx_layers=2)).eval()
    with torch.no_grad():
        for p in vae.parameters():
            if p.dim() == 2:
                p.mul_(10)
    z = torch.randn(4, 24, 8)
    must = torch.ones(4, 24, dtype=torch.bool)
    got = vae.decode_tokens(z, must_text=must)
    ref = _reference_greedy(vae, z, text=True)
    assert torch.equal(got, ref)
    assert len(set(ref.flatten().tolist())) > 10                          # a varied decoding, not one token


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_known_tokens_are_kept_and_must_text_bans_the_special_ids(loaded, temperature):
    vae, tok, ids = loaded
    z = _noisy_latents(vae, ids)
    B, L = ids.shape
    must = torch.ones(B, L, dtype=torch.bool)
    mask = torch.zeros(B, L, dtype=torch.bool)
    mask[:, 3] = True                                                     # one given token per row
    known = torch.full((B, L), 7)
    banned = torch.zeros(tok.vocab_size, dtype=torch.bool)
    banned[[tok.pad_id, tok.bos_id, tok.eos_id]] = True
    out = vae.decode_tokens(z, temperature=temperature, top_k=50, top_p=0.9, repetition_penalty=1.3,
                            generator=torch.Generator().manual_seed(0), must_text=must, banned=banned,
                            known_ids=known, known_mask=mask)
    assert out.shape == (B, L)
    assert torch.equal(out[:, 3], known[:, 3])
    assert not banned[out].any()                                          # never pad, bos or eos: all text
    assert (vae.decode_tokens(z) == tok.pad_id).any()                    # where the free decoding ends


def test_reconstruction_figures_decode_free_running(loaded):
    from tdiff.data.latents import reconstruction_metrics

    vae, tok, ids = loaded
    seqs = [[int(i) for i in row if i != tok.pad_id] for row in ids]
    mean, _ = vae.encode(ids)
    pred = vae.reconstruct(ids)
    assert torch.equal(pred, vae.decode_tokens(mean))                     # greedy, not teacher-forced
    m = reconstruction_metrics(vae, seqs, vae.config.max_len, tok.pad_id, "cpu")
    counted = torch.arange(ids.shape[1])[None, :] <= (ids != tok.pad_id).sum(1)[:, None]
    want = ((pred == ids) & counted).sum().item() / counted.sum().item()
    assert m["token_accuracy"] == pytest.approx(want)


def test_train_and_sample_on_a_contextual_vae(ctx, work):
    model = ctx / "model.safetensors"
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", ctx / "cvae.safetensors", "-o", model,
                 "--max-steps", "4", "--batch-size", "8", "--preset", "tiny", "--device", "cpu", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli(["sample", "-m", model, "-n", "3", "--steps", "2", "--seed", "3", "-q"])
    assert r.returncode == 0, r.stderr.decode()
    recs = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert len(recs) == 3 and all(rec["ids"] for rec in recs)            # at least one token: must_text at 0
    again = run_cli(["sample", "-m", model, "-n", "3", "--steps", "2", "--seed", "3", "-q"])
    assert again.stdout == r.stdout                                       # same seed, same texts
    r = run_cli(["sample", "-m", model, "-n", "2", "--steps", "2", "--length", "6", "-q"])
    assert r.returncode == 0, r.stderr.decode()
    assert [len(json.loads(line)["ids"]) for line in r.stdout.decode().splitlines()] == [6, 6]
    prompt = json.loads((work / "text.jsonl").read_text(encoding="utf-8").splitlines()[0])["text"][:3]
    r = run_cli(["sample", "-m", model, "-n", "2", "--steps", "2", "--prompt", prompt, "--temperature", "0.8", "-q"])
    assert r.returncode == 0, r.stderr.decode()
    texts = [json.loads(line)["text"] for line in r.stdout.decode().splitlines()]
    assert len(texts) == 2 and all(t.startswith(prompt) for t in texts)  # non-empty: the prompt, then the rest
    one_line_error(run_cli(["sample", "-m", model, "-n", "1", "--compile", "-q"]), 2, "--compile", "contextual")
    one_line_error(run_cli(["export", "-m", model, "-o", ctx / "ex", "--format", "export"]), 2,
                   "--format export", "contextual")
    assert not (ctx / "ex").exists()
    # --decoder parallel: the same latents through the VAE's parallel head (the parallel path's argmax)
    import torch

    from tdiff.api import load
    from tdiff.sampling.sample import SampleOptions, latents_to_ids

    m = load(model)
    par = m.generate(3, steps=2, seed=3, decoder="parallel")
    z = torch.randn(2, *m.bundle.latent_shape, generator=torch.Generator().manual_seed(0))
    heads = [latents_to_ids(m.bundle, z, SampleOptions(decoder=d), None) for d in ("parallel", "auto")]
    assert heads[0][:, 1:].tolist() == m.bundle.vae.decode(m.bundle.vae.denormalize(z))[:, 1:].argmax(-1).tolist()
    assert len(list(par)) == 3 and heads[0].tolist() != heads[1].tolist()   # the contextual decoder differs
    one_line_error(run_cli(["sample", "-m", work / "model.safetensors", "-n", "1", "--decoder", "contextual", "-q"]),
                   2, "--decoder contextual", "parallel decoder")


def test_bogus_decoder_is_a_usage_error(work, tmp_path):
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp_path / "v.safetensors",
                 "--decoder", "bogus", "--max-steps", "1"])
    one_line_error(r, 2, "--decoder", "bogus")
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", tmp_path / "v.safetensors",
                 "--decoder", "contextual", "--ctx-layers", "0", "--max-steps", "1"])
    assert r.returncode == 2 and b"--ctx-layers" in r.stderr
    assert not (tmp_path / "v.safetensors").exists()


def test_a_parallel_vae_file_without_the_new_keys_still_loads(work, tmp_path):
    from tdiff.files.artifacts import load_artifact, save_artifact
    from tdiff.formats.model import load_vae

    art = load_artifact(work / "vae.safetensors", expect=("vae",))
    new = ("decoder", "ctx_layers", "ctx_noise", "bos_id")
    assert art.config["vae"]["decoder"] == "parallel"
    old = {"vae": {k: v for k, v in art.config["vae"].items() if k not in new}}    # as written before the choice
    save_artifact(tmp_path / "old.safetensors", art.tensors, "vae", config=old, train=art.train,
                  tokenizer=art.tokenizer, tokenizer_meta=art.tokenizer_meta)
    vae, tok, _ = load_vae(tmp_path / "old.safetensors")
    ref, _, _ = load_vae(work / "vae.safetensors")
    assert vae.config == ref.config and not hasattr(vae, "ctx_blocks")
    ids = torch.tensor([[5, 6, 7, 8] + [tok.pad_id] * (vae.config.max_len - 4)])
    mean, _ = vae.encode(ids)
    assert torch.equal(vae.reconstruct(ids), vae.decode(mean).argmax(-1))      # the parallel argmax, as before
    assert torch.equal(vae.decode(mean), ref.decode(mean))
    with pytest.raises(ValueError, match="contextual"):
        vae.decode_tokens(mean)
