"""The networks a sampling run uses, prepared once for its dtype: `for_sampling`.

Under bf16/fp16 autocast every `nn.Linear` casts its float32 weight and bias to the compute dtype
on every call: 12 solver steps cast the denoiser's weights 12 times. `in_compute_dtype` stores them
cast instead, in a copy of the bundle, so the same products run without the copies. Autocast's cast
of a tensor already in its dtype is that tensor, so the ids are bit-identical (tests/sampling/
test_precision.py); the time saved is largest where the batch is small (docs/RESULTS.md, "Speed at
the limit"). `--compile` gets the same from Inductor's frozen weights (tdiff/sampling/compiled.py).
"""

from __future__ import annotations

import copy

# the VAE's modules that run under autocast when sampling (the encoder also runs outside it: prompts)
DECODER_PARTS = ("from_latent", "dec_blocks", "lm_head", "ctx_blocks")


def _cast_linears(module, dtype) -> None:
    import torch.nn as nn

    for m in module.modules():
        if isinstance(m, nn.Linear):
            m.to(dtype)


def in_compute_dtype(bundle, dtype_name: str):
    """A copy of BUNDLE whose denoiser and VAE decoder keep their linear layers' weights in DTYPE_NAME
    (bf16 or fp16), for sampling under that autocast; the original is untouched. fp32: BUNDLE."""
    from tdiff.core.device import torch_dtype

    if dtype_name == "fp32":
        return bundle
    dtype = torch_dtype(dtype_name)
    out = copy.copy(bundle)
    out.dit = copy.deepcopy(bundle.dit)
    _cast_linears(out.dit, dtype)
    vae = copy.copy(bundle.vae)                 # shares the encoder; its own table of submodules
    vae._modules = dict(bundle.vae._modules)
    for name in DECODER_PARTS:
        part = getattr(bundle.vae, name, None)
        if part is not None:
            setattr(vae, name, copy.deepcopy(part))
            _cast_linears(getattr(vae, name), dtype)
    out.vae = vae
    return out


def for_sampling(bundle, device, dtype_name: str, batch_size: int, compile: bool = False):
    """BUNDLE as a sampling run of BATCH_SIZE rows in DTYPE_NAME uses it: compiled (`compile_bundle`)
    with COMPILE, else with its weights in the compute dtype (`in_compute_dtype`)."""
    if compile:
        from tdiff.sampling.compiled import compile_bundle

        return compile_bundle(bundle, device, batch_size)
    return in_compute_dtype(bundle, dtype_name)
