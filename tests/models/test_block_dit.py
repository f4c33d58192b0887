"""Block-causal DiT (BD3-LM in latent space): the vectorised training forward equals block-by-block
sampling with a key/value cache, and the attention mask is BD3-LM's."""

import pytest
import torch

from tdiff.core.errors import ConfigError
from tdiff.models.dit import DiT, DiTConfig


def _dit(block_size, labels=2, **kw):
    torch.manual_seed(0)
    m = DiT(DiTConfig(latent_dim=8, max_len=22, d_model=32, n_layers=2, n_heads=2, num_labels=labels,
                      block_size=block_size, **kw))
    for p in m.parameters():                 # adaLN-Zero starts at the identity: give every weight a value
        torch.nn.init.normal_(p, std=0.1)
    return m.eval()


@pytest.mark.parametrize("bs", [4, 5, 1])
def test_vectorised_training_forward_equals_cached_blocks(bs):
    m = _dit(bs)
    B, N, C = 3, 22, 8
    K = -(-N // bs)
    g = torch.Generator().manual_seed(1)
    x0, xt, sc = (torch.randn(B, N, C, generator=g) for _ in range(3))
    t = torch.rand(B, K, generator=g)
    lab = torch.tensor([0, 1, -1])
    mask = (torch.rand(B, N, 1, generator=g) < 0.3).float()
    with torch.no_grad():
        full = m.forward_blocks(xt, t, x0, self_cond=sc, label=lab, cond_x=x0, cond_mask=mask)   # (B, N, C)
        cache, outs = [], []
        for k in range(K):
            s, e = k * bs, min(N, (k + 1) * bs)
            outs.append(m.forward_cached(xt[:, s:e], t[:, k], s, cache, self_cond=sc[:, s:e], label=lab,
                                         cond_x=x0[:, s:e], cond_mask=mask[:, s:e]))
            cache = m.extend_cache(x0[:, s:e], s, cache, label=lab)
    assert torch.allclose(full, torch.cat(outs, 1), atol=1e-5)
    assert len(cache) == 2 and cache[0][0].shape == (B, 2, N, 16)      # per layer (k, v) of all N clean positions


def test_a_block_sees_only_earlier_blocks():
    """Changing a later block's clean latents or noise leaves an earlier block's output unchanged;
    changing an earlier clean block changes a later one."""
    m = _dit(4)
    g = torch.Generator().manual_seed(2)
    x0, xt = torch.randn(2, 22, 8, generator=g), torch.randn(2, 22, 8, generator=g)
    t = torch.rand(2, 6, generator=g)
    with torch.no_grad():
        ref = m.forward_blocks(xt, t, x0)
        x0b, xtb = x0.clone(), xt.clone()
        x0b[:, 8:] += 1.0
        xtb[:, 8:] += 1.0
        out = m.forward_blocks(xtb, t, x0b)
        assert torch.equal(out[:, :8], ref[:, :8])          # blocks 0 and 1 do not see blocks 2…
        x0c = x0.clone()
        x0c[:, :4] += 1.0
        out = m.forward_blocks(xt, t, x0c)
        assert torch.equal(out[:, :4], ref[:, :4])          # a noisy block does not see its own clean copy
        assert not torch.allclose(out[:, 4:8], ref[:, 4:8])  # block 1 sees clean block 0


def test_block_mask_is_bd3lm_eq6():
    m = _dit(2, labels=0)
    M = m.block_mask(6, "cpu").int()                          # [noisy 0..5 ; clean 0..5]
    assert M[0].tolist() == [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]   # noisy block 0: itself only
    assert M[2].tolist() == [0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0]   # noisy block 1: itself + clean block 0
    assert M[8].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]   # clean block 1: clean blocks 0, 1


def test_block_size_range_and_parallel_default():
    assert DiTConfig(max_len=22).block == 22 and not DiTConfig(max_len=22).block_causal
    assert DiTConfig(max_len=22, block_size=22).block_causal is False
    with pytest.raises(ConfigError, match="block_size"):
        DiTConfig(max_len=22, block_size=23)
    with pytest.raises(ConfigError, match="block_size"):
        DiTConfig(max_len=22, block_size=-1)
