"""The sampling path's speed levers give the same samples: weights stored in the compute dtype
(bit-identical), the cached rotary tables, the compiled head's chunk, and the fused attention that
a compiled bf16 graph runs on CPU (within the agreement bf16 itself has)."""

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import run_cli


def _ids(bundle, n, dtype, seed=0, steps=4):
    from tdiff.core.seeds import generator
    from tdiff.sampling.sample import SampleOptions, latents_to_ids, sample_latents

    cpu = torch.device("cpu")
    opts = SampleOptions(num=n, batch_size=n, steps=steps, dtype=dtype)
    g = generator(seed, steps, "sample", cpu)
    return latents_to_ids(bundle, sample_latents(bundle, n, opts, g, cpu), opts, g)


def test_weights_in_the_compute_dtype_give_the_same_ids(work):
    from tdiff.formats.model import load_model
    from tdiff.sampling.precision import in_compute_dtype

    bundle = load_model(work / "model.safetensors")
    cast = in_compute_dtype(bundle, "bf16")
    assert cast.dit.in_proj.weight.dtype == torch.bfloat16 and cast.vae.lm_head.weight.dtype == torch.bfloat16
    assert cast.vae.from_latent.weight.dtype == torch.bfloat16
    assert bundle.dit.in_proj.weight.dtype == torch.float32 and bundle.vae.lm_head.weight.dtype == torch.float32
    assert cast.vae.to_latent is bundle.vae.to_latent                      # the encoder is shared, in float32
    assert in_compute_dtype(bundle, "fp32") is bundle
    assert torch.equal(_ids(bundle, 6, "bf16"), _ids(cast, 6, "bf16"))


def test_prompts_still_encode_with_the_cast_decoder(work):
    r = run_cli(["sample", "-m", work / "model.safetensors", "-n", "2", "--steps", "3", "--dtype", "bf16",
                 "--prompt", "春风", "--device", "cpu", "-q"])
    assert r.returncode == 0, r.stderr.decode()
    texts = [json.loads(line)["text"] for line in r.stdout.decode().splitlines()]
    assert len(texts) == 2 and all(t.startswith("春风") for t in texts)


def test_rotary_tables_are_cached_apart_for_autograd():
    from tdiff.models.layers import apply_rotary, rotary_cos_sin

    with torch.inference_mode():
        cos_i, _ = rotary_cos_sin(7, 8)
        assert rotary_cos_sin(7, 8)[0] is cos_i                              # the cached table
    cos, sin = rotary_cos_sin(7, 8)
    assert cos is not cos_i and torch.equal(cos, cos_i)                     # a table made outside inference mode
    inv = 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8)
    ang = torch.arange(7).float()[:, None] * inv
    assert torch.allclose(cos, torch.cat([ang, ang], -1).cos()) and torch.allclose(sin, torch.cat([ang, ang], -1).sin())
    x = torch.randn(2, 7, 8, requires_grad=True)
    apply_rotary(x, cos, sin).square().sum().backward()                    # usable in training after sampling
    assert x.grad is not None and x.grad.shape == x.shape


def test_math_attention_is_the_attention_of_sdpa():
    from tdiff.models.layers import math_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    mask = torch.rand(5, 5, generator=g) > 0.3
    mask[:, 0] = True                                                      # every query sees a key
    assert torch.allclose(math_attention(q, k, v), F.scaled_dot_product_attention(q, k, v), atol=1e-6)
    assert torch.allclose(math_attention(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                          atol=1e-6)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    out = math_attention(qb, kb, vb)
    assert out.dtype == torch.bfloat16
    assert (out.float() - F.scaled_dot_product_attention(q, k, v)).abs().max() < 0.05


def test_fused_math_only_in_compiled_inference_in_reduced_precision():
    from tdiff.models.layers import _fused_math

    x = torch.zeros(1, 2, 4)
    with torch.no_grad():
        assert not _fused_math(x, x.bfloat16())                             # eager: the SDPA kernel

    @torch.compile(backend="eager", fullgraph=True)
    def probe(x, c):
        return torch.tensor(_fused_math(x, c))

    with torch.no_grad():
        assert bool(probe(x, x.bfloat16())) and not bool(probe(x, x))         # compiled bf16 yes, float32 no
    assert not bool(probe(x, x.bfloat16()))                                 # with autograd (training) no


def test_compiled_head_is_not_padded_past_one_batch(work):
    from tdiff.formats.model import load_model
    from tdiff.sampling.compiled import HEAD_ROWS, compile_bundle

    bundle = load_model(work / "model.safetensors")
    L = bundle.vae.config.max_len
    assert compile_bundle(bundle, torch.device("cpu"), 1).greedy_head.rows == min(HEAD_ROWS, L)
    assert compile_bundle(bundle, torch.device("cpu"), 64).greedy_head.rows == HEAD_ROWS


@pytest.mark.slow
def test_compiled_bf16_samples_what_eager_bf16_samples(work):
    from tdiff.formats.model import load_model
    from tdiff.sampling.compiled import compile_bundle, compile_problem

    cpu = torch.device("cpu")
    if compile_problem(cpu):
        pytest.skip(compile_problem(cpu))
    bundle = load_model(work / "model.safetensors")
    eager = _ids(bundle, 8, "bf16")
    comp = _ids(compile_bundle(bundle, cpu, 8), 8, "bf16")                  # the fused attention of `_fused_math`
    assert (comp == eager).float().mean() >= 0.98
