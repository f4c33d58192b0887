"""torch.compile for sampling: `tdiff sample --compile` and `tdiff eval --speed --compile`.

`compile_bundle` returns a copy of a Bundle whose denoiser network, VAE decoder and greedy
output head are `torch.compile`d (TorchInductor). The solver stays plain Python: only the
network calls are compiled, so every solver, guidance, spans and self-conditioning work as in
eager mode.

- CPU: Inductor generates C++/OpenMP kernels (it needs a C++ compiler) with *freezing* on: the
  weights are constants of the compiled graph, so under bf16 autocast they are cast and
  prepacked for oneDNN once instead of on every call, and norms, adaLN modulation, GELU and the
  residual adds are fused. Measured on a 2-core AMX CPU (docs/RESULTS.md, "Inference speed levers"):
  1.5–1.8× eager at batch 1 and 64 after 12–30 s of compiling.
- CUDA: mode "reduce-overhead" adds CUDA graphs (the whole network call replayed as one graph),
  which removes the per-kernel launch cost that dominates at batch 1. Only on a CUDA device.
- Shapes are static: a batch smaller than the compiled one (the last batch of a run) is padded
  with zero rows and the rows cut off again (no op of either network mixes examples), so one
  compilation serves a whole run.

Compiled graphs take the weights as constants: compile a bundle only for sampling, never one
that is still training.
"""

from __future__ import annotations

import copy
import shutil

from tdiff.core.errors import UsageError

HEAD_ROWS = 256      # positions per call of the compiled greedy head (fixed shape; the last chunk is padded)


def compile_problem(device) -> str | None:
    """Why `--compile` cannot work on DEVICE here, or None."""
    import importlib.util

    if importlib.util.find_spec("torch._inductor") is None:     # pragma: no cover - every supported torch has it
        return "TorchInductor is unavailable in this torch"
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "TorchInductor needs a C++ compiler on CPU (install g++ or clang++)"
    return None


def _pad_rows(v, size: int):
    """Tensor V (b, ...) padded with zero rows to (size, ...); anything else unchanged."""
    import torch

    if not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] >= size:
        return v
    pad = v.new_zeros((size - v.shape[0],) + tuple(v.shape[1:]))
    return torch.cat([v, pad])


class StaticBatch:
    """Calls FN with every batched tensor argument padded to at least SIZE rows; returns the first
    b rows of the output. A larger batch raises SIZE (and Inductor compiles once more)."""

    def __init__(self, fn, size: int):
        self.fn, self.size = fn, size

    def __call__(self, x, *args, **kwargs):
        b = x.shape[0]
        self.size = max(self.size, b)
        n = self.size
        args = [_pad_rows(a, n) if getattr(a, "shape", None) and a.shape[0] == b else a for a in args]
        kwargs = {k: _pad_rows(v, n) if getattr(v, "shape", None) and v.shape[0] == b else v
                  for k, v in kwargs.items()}
        out = self.fn(_pad_rows(x, n), *args, **kwargs)
        return out[:b]


class CompiledHead:
    """`greedy_head` compiled for chunks of exactly ROWS positions (the last chunk padded): HEAD_ROWS,
    or the positions of one whole batch where that is fewer (a batch of 1 × 128 tokens is not padded to
    256 rows: half the head's work)."""

    def __init__(self, fn, rows: int = HEAD_ROWS):
        self.fn, self.rows = fn, rows

    def __call__(self, lm_head, h, must, banned):
        import torch

        out, n = [], self.rows
        for r in range(0, h.shape[0], n):
            hc, mc = h[r:r + n], must[r:r + n]
            k = hc.shape[0]
            out.append(self.fn(lm_head, _pad_rows(hc, n), _pad_rows(mc, n), banned)[:k])
        return torch.cat(out)


def compile_bundle(bundle, device, batch_size: int):
    """A copy of BUNDLE whose DiT, VAE decoder and greedy head run through torch.compile
    (the original bundle is untouched). Raises UsageError where compiling cannot work, and for a VAE
    with the contextual decoder (its token-by-token loop is not compiled)."""
    import torch
    import torch._inductor.config as inductor

    if bundle.vae.config.decoder == "contextual":
        raise UsageError("--compile: this model's VAE has the contextual decoder, which decodes token by token "
                         "and is not compiled; sample without --compile")
    if bundle.dit.config.block_causal:
        raise UsageError("--compile: a block-causal model is sampled block by block with a key/value cache, "
                         "which is not compiled; sample without --compile")
    why = compile_problem(device)
    if why:
        raise UsageError(f"--compile: {why}")
    if device.type == "cpu":
        inductor.freezing = True            # weights as constants: cast and prepacked once (CPU only)
    mode = "reduce-overhead" if device.type == "cuda" else None    # CUDA graphs behind the device check
    from tdiff.models.layers import rotary_cos_sin

    with torch.no_grad():            # the rotary tables the graphs read, made before tracing (a miss compiles twice)
        rotary_cos_sin(bundle.dit.config.max_len, bundle.dit.head_dim, bundle.dit.config.rope_base, device)
        rotary_cos_sin(bundle.vae.config.max_len, bundle.vae.head_dim, bundle.vae.config.rope_base, device)
    out = copy.copy(bundle)
    vae = copy.copy(bundle.vae)                # a shallow copy: the same weights, its own decode_hidden
    out.vae = vae
    out.dit = StaticBatch(torch.compile(bundle.dit, dynamic=False, mode=mode), batch_size)
    out.dit.config = bundle.dit.config
    vae.decode_hidden = StaticBatch(torch.compile(bundle.vae.decode_hidden, dynamic=False, mode=mode), batch_size)
    from tdiff.sampling.sample import greedy_head

    rows = min(HEAD_ROWS, batch_size * bundle.vae.config.max_len)
    out.greedy_head = CompiledHead(torch.compile(greedy_head, dynamic=False, mode=mode), rows)
    return out
