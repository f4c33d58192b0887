"""Unit tests of the networks in tdiff/models: shapes, configs, adaLN-Zero, rotary, VAE loss terms.

All models here are tiny so the whole file runs in seconds on one CPU core.
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from tdiff.models import dit as dit_mod  # noqa: E402
from tdiff.models import vae as vae_mod  # noqa: E402
from tdiff.models.dit import DiT, DiTConfig  # noqa: E402
from tdiff.models.layers import Attention, apply_rotary, rotary_cos_sin  # noqa: E402
from tdiff.models.vae import TextVAE, VAEConfig, text_lengths  # noqa: E402

PAD = 3


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run fastest on one thread; on a loaded machine, 2 threads took 7x longer."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def small_vae(**kw) -> TextVAE:
    cfg = dict(vocab_size=50, max_len=16, d_model=32, n_layers=1, n_heads=2, latent_dim=8)
    cfg.update(kw)
    return TextVAE(VAEConfig(**cfg))


def small_dit(**kw) -> DiT:
    cfg = dict(latent_dim=8, max_len=16, d_model=32, n_layers=2, n_heads=2)
    cfg.update(kw)
    return DiT(DiTConfig(**cfg))


def padded_batch(B, L, V, seed, min_len=None):
    """Random token rows (ids 4..V-1) of random length, right-padded with PAD."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V, (B, L), generator=g)
    lengths = torch.randint(min_len or L // 4, L, (B,), generator=g)
    ids[torch.arange(L)[None, :] >= lengths[:, None]] = PAD
    return ids, lengths


def randomize_(model, seed=0, std=0.1):
    """Give every parameter (zero-initialised ones included) random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


# ------------------------------------------------------------------------------- shapes

@pytest.mark.parametrize("stride", [1, 2, 4])
def test_vae_shapes(stride):
    torch.manual_seed(0)
    m = small_vae(latent_stride=stride)
    ids, _ = padded_batch(3, 16, 50, seed=0)
    mean, logvar = m.encode(ids)
    assert mean.shape == logvar.shape == (3, 16 // stride, 8)
    assert mean.dtype == torch.float32
    logits = m.decode(mean)
    assert logits.shape == (3, 16, 50)
    out = m(ids, beta=0.1, free_bits=0.1)
    assert set(out) >= {"loss", "rec", "kl", "acc"}
    assert out["loss"].dim() == 0 and torch.isfinite(out["loss"])
    assert m.reconstruct(ids).shape == (3, 16)
    assert 0.0 <= m.token_accuracy(ids) <= 1.0
    assert m.config.latent_len == 16 // stride


@pytest.mark.parametrize("stride", [1, 2, 4])
def test_dit_shapes(stride):
    torch.manual_seed(0)
    N = 16 // stride
    m = small_dit(max_len=N, num_labels=3)
    x = torch.randn(2, N, 8)
    mask = torch.zeros(2, N, 1)
    mask[:, :2] = 1
    out = m(x, torch.rand(2), self_cond=torch.randn(2, N, 8), label=torch.tensor([0, -1]),
            cond_x=torch.randn(2, N, 8), cond_mask=mask)
    assert out.shape == (2, N, 8)
    assert m(x, 0.5).shape == (2, N, 8)  # scalar t, nothing optional given
    assert m(x, torch.tensor([0.3, 0.7]), cond_mask=mask[..., 0]).shape == (2, N, 8)  # (B, N) mask
    with pytest.raises(ValueError):
        m(torch.randn(1, N + 1, 8), 0.5)  # longer than max_len


def test_text_lengths():
    ids = torch.tensor([[5, 6, PAD, PAD], [5, 6, 7, 8], [PAD, PAD, PAD, PAD]])
    assert text_lengths(ids, PAD).tolist() == [2, 4, 0]


# ------------------------------------------------------------------------------- configs

def test_config_round_trip():
    v = VAEConfig(vocab_size=100, max_len=32, latent_stride=2, latent_noise=0.2, n_dec_layers=3)
    assert VAEConfig.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    d = DiTConfig(latent_dim=16, max_len=8, num_labels=5, self_condition=False)
    assert DiTConfig.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    # a rebuilt model has identical weight names and shapes
    assert TextVAE(VAEConfig.from_dict(v.to_dict())).state_dict().keys() == TextVAE(v).state_dict().keys()


def test_config_errors():
    with pytest.raises(ValueError, match="unknown key"):
        VAEConfig.from_dict({**VAEConfig(vocab_size=10, max_len=8).to_dict(), "n_layer": 2})
    with pytest.raises(ValueError, match="unknown key"):
        DiTConfig.from_dict({"latent_dm": 3})
    with pytest.raises(ValueError):
        VAEConfig.from_dict({"max_len": 8})  # vocab_size missing
    with pytest.raises(ValueError, match="latent_stride"):
        VAEConfig(vocab_size=10, max_len=8, latent_stride=3)
    with pytest.raises(ValueError):
        VAEConfig(vocab_size=10, max_len=10, latent_stride=4)  # not a multiple
    with pytest.raises(ValueError):
        DiTConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError):
        VAEConfig.from_preset("huge", vocab_size=10, max_len=8)


def test_presets_build():
    for name in vae_mod.PRESETS:
        cfg = VAEConfig.from_preset(name, vocab_size=1000, max_len=64)
        assert cfg.d_model == vae_mod.PRESETS[name]["d_model"]
    for name in dit_mod.PRESETS:
        cfg = DiTConfig.from_preset(name, latent_dim=32, max_len=64)
        assert cfg.d_model == dit_mod.PRESETS[name]["d_model"]
    m = TextVAE(VAEConfig.from_preset("tiny", vocab_size=1000, max_len=64))
    assert m.num_params() == sum(p.numel() for p in m.parameters()) > 0
    assert DiT(DiTConfig.from_preset("tiny")).num_params() > 0


# ------------------------------------------------------------------------------- adaLN-Zero

def test_dit_zero_init_output_and_identity_blocks():
    torch.manual_seed(0)
    m = small_dit(num_labels=4)
    x = torch.randn(2, 16, 8)
    out = m(x, torch.rand(2), self_cond=torch.randn(2, 16, 8), label=torch.tensor([1, 2]))
    assert torch.equal(out, torch.zeros_like(out))  # final layer zero-init: exactly zero
    h = torch.randn(2, 16, 32)
    c_act = torch.randn(2, 32)
    rope = rotary_cos_sin(16, m.head_dim)
    for blk in m.blocks:
        assert torch.equal(blk(h, c_act, rope), h)  # gates are zero: each block is the identity


def test_dit_conditioning_paths():
    torch.manual_seed(0)
    m = small_dit(num_labels=3)
    randomize_(m)
    x = torch.randn(2, 16, 8)
    t = torch.tensor([0.2, 0.9])
    # absent inputs mean zeros / the null class
    assert torch.allclose(m(x, t), m(x, t, self_cond=torch.zeros_like(x), label=torch.tensor([-1, -1])))
    assert torch.allclose(m(x, t), m(x, t, label=torch.tensor([3, 3])))  # index num_labels = null
    assert not torch.allclose(m(x, t, label=torch.tensor([0, 0])), m(x, t, label=torch.tensor([1, 1])))
    assert not torch.allclose(m(x, t), m(x, t + 0.1))
    # scalar t == per-row t
    assert torch.allclose(m(x, 0.5), m(x, torch.tensor([0.5, 0.5])))
    # cond_x only matters where cond_mask is 1
    mask = torch.zeros(2, 16, 1)
    mask[:, :4] = 1
    cx = torch.randn(2, 16, 8)
    cx2 = cx.clone()
    cx2[:, 4:] = torch.randn(2, 12, 8)
    assert torch.allclose(m(x, t, cond_x=cx, cond_mask=mask), m(x, t, cond_x=cx2, cond_mask=mask))
    assert not torch.allclose(m(x, t, cond_x=cx, cond_mask=mask), m(x, t))
    with pytest.raises(ValueError):
        small_dit()(x, t, label=torch.tensor([0, 1]))  # unconditional model
    with pytest.raises(ValueError):
        small_dit(self_condition=False)(x, t, self_cond=x)
    with pytest.raises(ValueError):
        m(x, t, cond_x=cx)  # values without a mask


# ------------------------------------------------------------------------------- rotary, attention

def test_rotary_scores_depend_on_relative_position_only():
    torch.manual_seed(0)
    hd, T = 16, 64
    cos, sin = rotary_cos_sin(T, hd)
    q, k = torch.randn(hd), torch.randn(hd)

    def score(m, n):  # q at position m, k at position n
        qm = apply_rotary(q[None], cos[m:m + 1], sin[m:m + 1])[0]
        kn = apply_rotary(k[None], cos[n:n + 1], sin[n:n + 1])[0]
        return torch.dot(qm, kn).item()

    for m, n in [(0, 5), (3, 3), (10, 2)]:
        ref = score(m, n)
        for shift in (1, 7, 40):
            assert score(m + shift, n + shift) == pytest.approx(ref, abs=1e-4)
    assert score(0, 5) != pytest.approx(score(0, 6), abs=1e-3)  # but it does depend on the offset
    # a rotation preserves norms
    assert apply_rotary(q[None], cos[9:10], sin[9:10]).norm().item() == pytest.approx(q.norm().item(), rel=1e-5)


def test_attention_key_padding_mask():
    torch.manual_seed(0)
    att = Attention(16, 2).eval()
    x = torch.randn(2, 6, 16)
    keep = torch.tensor([[True] * 4 + [False] * 2] * 2)
    rope = rotary_cos_sin(6, 8)
    y = att(x, rope, keep)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(2, 2, 16)  # change only the masked positions
    y2 = att(x2, rope, keep)
    assert torch.allclose(y[:, :4], y2[:, :4], atol=1e-6)
    assert not torch.allclose(att(x, rope)[:, :4], att(x2, rope)[:, :4])  # without a mask they matter


# ------------------------------------------------------------------------------- VAE loss terms

def test_free_bits_floor():
    torch.manual_seed(0)
    m = small_vae()
    with torch.no_grad():  # posterior == prior: mean 0, logvar 0, true KL exactly 0
        m.to_latent.weight.zero_()
        m.to_latent.bias.zero_()
    ids, _ = padded_batch(4, 16, 50, seed=1)
    out = m(ids, beta=1.0, free_bits=0.25)
    assert out["kl_raw"].item() == pytest.approx(0.0, abs=1e-6)
    assert out["kl"].item() == pytest.approx(0.25 * 8)
    assert out["loss"].item() == pytest.approx(out["rec"].item() + 0.25 * 8, rel=1e-6)
    # below the floor the KL term sends no gradient: beta changes nothing in the gradients
    m.eval()
    grads = []
    for beta in (0.0, 1.0):
        m.zero_grad()
        m(ids, beta=beta, free_bits=0.25, sample=False)["loss"].backward()
        grads.append(m.to_latent.bias.grad.clone())
    assert torch.equal(grads[0], grads[1])
    # above the floor kl == kl_raw
    m2 = small_vae()
    out2 = m2(ids, beta=1.0, free_bits=0.0)
    assert out2["kl"].item() == pytest.approx(out2["kl_raw"].item())
    assert out2["kl"].item() > 0


def test_kl_matches_closed_form():
    torch.manual_seed(0)
    m = small_vae().eval()
    ids, _ = padded_batch(4, 16, 50, seed=2)
    mean, logvar = m.encode(ids)
    ref = (0.5 * (mean**2 + logvar.exp() - 1 - logvar)).mean(dim=(0, 1)).sum()
    assert m(ids, beta=1.0, sample=False)["kl_raw"].item() == pytest.approx(ref.item(), rel=1e-5)


def test_normalize_round_trip():
    m = small_vae()
    m.set_latent_stats(torch.linspace(-1, 1, 8), torch.linspace(0.5, 2, 8))
    z = torch.randn(2, 16, 8)
    assert torch.allclose(m.denormalize(m.normalize(z)), z, atol=1e-6)
    assert "latent_mean" in m.state_dict() and "latent_std" in m.state_dict()


def test_vae_overfits_small_batch():
    """64 fixed random sequences, 100 steps: plumbing works, accuracy and decoded lengths right."""
    torch.manual_seed(0)
    V, L = 64, 32
    ids, lengths = padded_batch(64, L, V, seed=0)
    m = TextVAE(VAEConfig(vocab_size=V, max_len=L, d_model=64, n_layers=1, n_heads=2, latent_dim=16))
    opt = torch.optim.AdamW(m.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))  # warm-up
    first = None
    for step in range(100):
        out = m(ids, beta=1e-3, free_bits=0.0)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        sched.step()
        first = first if first is not None else out["loss"].item()
    assert out["loss"].item() < 0.2 * first
    m.eval()
    assert m.token_accuracy(ids) > 0.9
    rec = m.reconstruct(ids)
    assert torch.equal(text_lengths(rec, PAD), lengths)  # decoded length == input length


# ------------------------------------------------------------------------------- precision, determinism

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_cpu(dtype):
    torch.manual_seed(0)
    vae = small_vae(latent_stride=2)
    ids, _ = padded_batch(2, 16, 50, seed=3)
    with torch.autocast("cpu", dtype=dtype):
        out = vae(ids, beta=0.1)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in vae.parameters() if p.requires_grad)
    dit = small_dit(max_len=8, num_labels=2)
    randomize_(dit)
    x, t, label = torch.randn(2, 8, 8), torch.rand(2), torch.tensor([0, 1])
    ref = dit(x, t, label=label)
    with torch.autocast("cpu", dtype=dtype):
        out = dit(x, t, label=label)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert (out - ref).norm() < 0.05 * ref.norm()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_cuda(dtype):
    torch.manual_seed(0)
    vae = small_vae(latent_stride=2).cuda()
    ids, _ = padded_batch(2, 16, 50, seed=3)
    with torch.autocast("cuda", dtype=dtype):
        out = vae(ids.cuda(), beta=0.1)
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
    dit = small_dit(max_len=8, num_labels=2).cuda()
    randomize_(dit)
    x, t, label = torch.randn(2, 8, 8).cuda(), torch.rand(2).cuda(), torch.tensor([0, -1]).cuda()
    ref = dit(x, t, label=label)
    with torch.autocast("cuda", dtype=dtype):
        out = dit(x, t, label=label)
    assert out.dtype == torch.float32 and (out - ref).norm() < 0.05 * ref.norm()


def test_half_weights_forward():
    """Slim bf16 / fp16 inference weights (export) run without autocast on float32 inputs."""
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16):
        dit = small_dit().to(dtype)
        x = torch.randn(2, 16, 8)
        assert dit(x, torch.rand(2)).dtype == torch.float32
        vae = small_vae().to(dtype)
        ids, _ = padded_batch(2, 16, 50, seed=4)
        mean, _ = vae.encode(ids)
        assert vae.decode(mean).shape == (2, 16, 50)


def test_determinism_with_seed():
    ids, _ = padded_batch(4, 16, 50, seed=5)

    def run():
        torch.manual_seed(123)
        m = small_vae(dropout=0.1)
        return m(ids, beta=0.1)["loss"].item(), m.decode(torch.ones(1, 16, 8))

    (l1, d1), (l2, d2) = run(), run()
    assert l1 == l2 and torch.equal(d1, d2)
    torch.manual_seed(7)
    a = small_dit()
    torch.manual_seed(7)
    b = small_dit()
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_regression_numbers():
    """Pinned numbers: a change to initialisation or the forward pass shows up here."""
    torch.manual_seed(0)
    m = small_vae()
    ids, _ = padded_batch(4, 16, 50, seed=0)
    out = m(ids, beta=0.01, free_bits=0.0, sample=False)
    assert out["rec"].item() == pytest.approx(math.log(50), rel=0.02)  # uniform at init
    assert out["rec"].item() == pytest.approx(REC_AT_INIT, rel=1e-4)
    torch.manual_seed(0)
    d = small_dit()
    randomize_(d)
    x = torch.linspace(-1, 1, 2 * 16 * 8).reshape(2, 16, 8)
    assert d(x, torch.tensor([0.25, 0.75])).abs().sum().item() == pytest.approx(DIT_ABS_SUM, rel=1e-4)


REC_AT_INIT = 3.942798137664795  # torch 2.13 CPU
DIT_ABS_SUM = 122.223876953125
