"""Transformer building blocks shared by the text VAE and the DiT denoiser.

- RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").
- Rotary position embedding, RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer
  with Rotary Position Embedding"), applied to queries and keys so that attention
  scores depend on relative position only.
- Bidirectional multi-head attention through `torch.nn.functional.scaled_dot_product_attention`
  (flash / memory-efficient kernels where the backend has them), with an optional
  boolean key-padding mask.
- MLP: GELU (Hendrycks & Gimpel 2016) or SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer").
- Pre-norm residual `Block` (Xiong et al. 2020, "On Layer Normalization in the Transformer
  Architecture").

Everything runs under bf16/fp16 autocast on CPU and CUDA: normalisation and the rotary
rotation are computed in float32 and cast back to the input dtype.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from tdiff.core import errors

MLP_KINDS = ("gelu", "swiglu")
MAX_LAYERS = 256       # a config asking for more is damaged, not a model (it would take long to even build)


def require(ok: bool, what: str, field: str, problem: str) -> None:
    """Raise tdiff.errors.ConfigError("<WHAT> config", FIELD, PROBLEM) unless OK."""
    errors.require(ok, f"{what} config", field, problem)


def check_keys(cls, d: dict, what: str) -> None:
    """D may build dataclass CLS: no unknown key (nothing is silently dropped) and every key without
    a default present (ConfigError naming the first key at fault)."""
    known = {f.name: f for f in fields(cls)}
    for key in d:
        require(key in known, what, str(key), f"is an unknown key (known: {', '.join(sorted(known))})")
    for name, f in known.items():
        required = f.default is MISSING and f.default_factory is MISSING
        require(name in d or not required, what, name, "is missing")


def check_transformer(what: str, d_model: int, n_heads: int, n_layers: int, mlp_ratio: float, mlp: str,
                      dropout: float, rope_base: float) -> None:
    """The size fields shared by the VAE and the DiT: positive sizes, an even rotary head
    dimension, a non-empty MLP, dropout in [0, 1), a rotary base above 1 (ConfigError otherwise)."""
    require(d_model >= 1, what, "d_model", f"must be >= 1, got {d_model}")
    require(1 <= n_heads and d_model % n_heads == 0 and (d_model // n_heads) % 2 == 0, what, "n_heads",
            f"must divide d_model ({d_model}) into heads of an even size (rotary), got {n_heads}")
    require(1 <= n_layers <= MAX_LAYERS, what, "n_layers", f"must be in 1..{MAX_LAYERS}, got {n_layers}")
    require(mlp in MLP_KINDS, what, "mlp", f"must be one of {', '.join(MLP_KINDS)}, got {mlp!r}")
    require(mlp_ratio > 0 and mlp_hidden(d_model, mlp_ratio, mlp) >= 1, what, "mlp_ratio",
            f"must give a hidden width >= 1 (ratio > 0), got {mlp_ratio}")
    require(0.0 <= dropout < 1.0, what, "dropout", f"must be in [0, 1), got {dropout}")
    require(rope_base > 1.0, what, "rope_base", f"must be > 1, got {rope_base}")


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float = 1e-6, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.float()
        return y.to(x.dtype)


# ---------------------------------------------------------------- rotary embedding

ROTARY_TABLES = 64    # (cos, sin) tables kept by `rotary_cos_sin` (lengths × devices × modes in use)
_rotary: dict = {}


def rotary_cos_sin(seq_len: int, head_dim: int, base: float = 10000.0, device=None):
    """cos, sin tables of RoPE (Su et al. 2021, eq. 34), each (T, head_dim), float32.

    Frequencies θ_i = base^(-2i/d) for i < d/2; channel i and i + d/2 form one rotating pair
    (the "rotate half" layout of GPT-NeoX / LLaMA). Kept in a small table cache (no buffer is saved
    in checkpoints or lowered by `.half()`), apart for autograd on and off (a table made in inference
    mode may not be saved for a later backward). Under torch.compile a cached table is a graph input;
    computed in the graph, Inductor folds cos/sin into the rotation's kernel and evaluates them per
    element of q and k, (B, nh, T, hd) instead of (T, hd) (docs/RESULTS.md, "Speed at the limit").
    """
    assert head_dim % 2 == 0, "rotary needs an even head dimension"
    device = torch.device("cpu") if device is None else torch.device(device)
    key = (seq_len, head_dim, float(base), device, torch.is_grad_enabled())
    hit = _rotary.get(key)
    if hit is not None:
        return hit
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    pos = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = pos[:, None] * inv_freq[None, :]  # (T, hd/2); broadcasting, so autocast never lowers it
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
    if len(_rotary) >= ROTARY_TABLES:
        _rotary.clear()
    _rotary[key] = hit = (emb.cos(), emb.sin())
    return hit


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype=None) -> torch.Tensor:
    """Rotate x (..., T, hd) by position: x·cos + rotate_half(x)·sin, computed in float32,
    returned in `dtype` (default: x's dtype)."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)  # (..., T, hd/2) each
    rotated = torch.cat((-x2, x1), dim=-1)  # (..., T, hd)
    return (xf * cos + rotated * sin).to(dtype or x.dtype)


# ---------------------------------------------------------------- attention, MLP, block

def _attn_dtype(x: torch.Tensor, computed: torch.Tensor):
    """The dtype attention runs in: float32 on CPU (see `Attention`), else the projections' dtype."""
    return torch.float32 if x.device.type == "cpu" else computed.dtype


def _fused_math(x: torch.Tensor, computed: torch.Tensor) -> bool:
    """Whether attention is written as plain ops (`math_attention`) rather than an SDPA call: on CPU,
    in a graph TorchInductor is compiling for inference (`tdiff sample --compile`), under bf16/fp16
    autocast. Inductor fuses the scaling, softmax and casts into one kernel around two reduced-precision
    matmuls: 1.4× the float32 SDPA kernel at batch 64 for heads of 32 and 64 (docs/RESULTS.md,
    "Speed at the limit"). Training and eager sampling keep the SDPA kernel."""
    return (x.device.type == "cpu" and computed.dtype != torch.float32 and not torch.is_grad_enabled()
            and torch.compiler.is_compiling())


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    """softmax(q kᵀ / √d) v (Vaswani et al. 2017, eq. 1) as plain ops: q (B, nh, T, hd), k and v
    (B, nh, S, hd); MASK bool broadcast to (B, nh, T, S), True = may attend. The two products run in
    q's dtype, the scores are scaled and normalised in float32 (as SDPA's kernels do), the weights
    cast back for the second product. Returns (B, nh, T, hd) in v's dtype."""
    scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5  # (B, nh, T, S) float32
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1).to(v.dtype) @ v  # (B, nh, T, hd)


class Attention(nn.Module):
    """Bidirectional multi-head self-attention with rotary q/k and SDPA (Vaswani et al. 2017).

    On CPU the attention itself runs in float32 even under bf16/fp16 autocast: PyTorch's CPU
    SDPA kernels have no fast reduced-precision path (figures in docs/RESULTS.md, "Design
    measurements"), and q, k leave the rotary rotation in float32 anyway. The exception is a graph
    that TorchInductor compiles for sampling under autocast (`_fused_math`): there it is written out
    as plain ops in the autocast dtype, which Inductor fuses. On CUDA it runs in the autocast dtype.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = False):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor, rope=None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D); rope = (cos, sin) from `rotary_cos_sin` or None; attn_mask (B, T) bool,
        True = this key may be attended to (a key padding mask). Returns (B, T, D)."""
        mask = None if attn_mask is None else attn_mask[:, None, None, :].to(torch.bool)  # (B, 1, 1, T): keys
        return self.attend(x, rope, mask=mask)

    def attend(self, x: torch.Tensor, rope=None, *, mask: torch.Tensor | None = None, past=None,
               keep_kv: bool = False):
        """Attention of x (B, T, D) over PAST keys/values (k, v) (B, nh, P, hd) (already rotated; None:
        none) and x's own, under MASK bool broadcast to (B, nh, T, P + T) (True = may attend; None:
        everything; e.g. (T, P + T), or (B, 1, 1, T) for key padding), rope =
        (cos, sin) of x's T positions. Returns (B, T, D), or with KEEP_KV also x's (k, v)
        (B, nh, T, hd) for a later call's PAST (a key/value cache; block-causal diffusion)."""
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim)  # (B, T, 3, nh, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, nh, T, hd) each
        fused = _fused_math(x, qkv)
        attn_dtype = qkv.dtype if fused else _attn_dtype(x, qkv)
        if rope is not None:
            cos, sin = rope
            q = apply_rotary(q, cos, sin, attn_dtype)
            k = apply_rotary(k, cos, sin, attn_dtype)
        q, k, v = q.to(attn_dtype), k.to(attn_dtype), v.to(attn_dtype)
        own = (k, v)
        if past is not None:
            k = torch.cat([past[0].to(attn_dtype), k], dim=2)  # (B, nh, P + T, hd)
            v = torch.cat([past[1].to(attn_dtype), v], dim=2)  # (B, nh, P + T, hd)
        if fused:
            y = math_attention(q, k, v, mask)  # (B, nh, T, hd)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                               dropout_p=self.dropout if self.training else 0.0)  # (B, nh, T, hd)
        y = self.proj(y.to(qkv.dtype).transpose(1, 2).reshape(B, T, D))  # (B, T, D)
        return (y, own) if keep_kv else y


def mlp_hidden(d_model: int, mlp_ratio: float, kind: str) -> int:
    """Hidden width: ratio·d for GELU; 2/3 of that for SwiGLU (same parameter count), rounded up to 32."""
    h = int(mlp_ratio * d_model)
    if kind == "swiglu":
        h = int(2 * h / 3)
        h = 32 * ((h + 31) // 32)
    return h


class MLP(nn.Module):
    """Position-wise feed-forward: GELU (tanh approximation) or SwiGLU (Shazeer 2020)."""

    def __init__(self, d_model: int, hidden: int, kind: str = "gelu", bias: bool = False):
        super().__init__()
        if kind not in MLP_KINDS:
            raise ValueError(f"unknown MLP kind {kind!r}; choose one of {', '.join(MLP_KINDS)}")
        self.kind = kind
        self.fc = nn.Linear(d_model, 2 * hidden if kind == "swiglu" else hidden, bias=bias)
        self.proj = nn.Linear(hidden, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # (B, T, H) or (B, T, 2H)
        if self.kind == "swiglu":
            a, b = h.chunk(2, dim=-1)
            h = F.silu(a) * b  # (B, T, H)
        else:
            h = F.gelu(h, approximate="tanh")  # (B, T, H)
        return self.proj(h)  # (B, T, D)


class Block(nn.Module):
    """Pre-norm Transformer block: x + Attn(RMSNorm(x)), then x + MLP(RMSNorm(x))."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: float = 4.0, mlp: str = "gelu",
                 dropout: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.attn = Attention(d_model, n_heads, dropout=dropout)
        self.norm2 = RMSNorm(d_model)
        self.mlp = MLP(d_model, mlp_hidden(d_model, mlp_ratio, mlp), kind=mlp)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, rope=None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x), rope, attn_mask))  # (B, T, D)
        x = x + self.drop(self.mlp(self.norm2(x)))  # (B, T, D)
        return x


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2 style initialisation: N(0, std) for linear and embedding weights, zero biases."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)


# ---------------------------------------------------------------- causal decoder with a memory

class KVCache:
    """Self-attention keys and values of the positions decoded so far, for token-by-token decoding:
    one (B, nh, SIZE, hd) buffer each, allocated at the first append and filled one position at a time."""

    def __init__(self, size: int):
        self.size = size
        self.k = self.v = None

    def append(self, k: torch.Tensor, v: torch.Tensor, start: int):
        """Store K, V (B, nh, 1, hd) at position START; return the keys and values of positions
        0..START, (B, nh, START + 1, hd) each."""
        if self.k is None:
            shape = tuple(k.shape[:2]) + (self.size, k.shape[-1])
            self.k, self.v = k.new_empty(shape), v.new_empty(shape)  # (B, nh, SIZE, hd) each
        self.k[:, :, start:start + 1] = k
        self.v[:, :, start:start + 1] = v
        return self.k[:, :, :start + 1], self.v[:, :, :start + 1]


class CausalSelfAttention(Attention):
    """Causal multi-head self-attention with rotary q/k (Vaswani et al. 2017), with a KV cache for
    token-by-token decoding (`Attention`'s projections, no biases)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__(d_model, n_heads, dropout=dropout, bias=False)

    def forward(self, x: torch.Tensor, rope, start: int = 0, cache: KVCache | None = None) -> torch.Tensor:
        """x (B, T, D) at positions START..START+T-1; rope = (cos, sin) tables covering them. Without
        CACHE: causal attention within x (START = 0). With one: x is one position (T = 1) attending to
        itself and the cached positions before it. Returns (B, T, D)."""
        B, T, D = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.n_heads, self.head_dim)  # (B, T, 3, nh, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, nh, T, hd) each
        dt = _attn_dtype(x, qkv)
        cos, sin = rope[0][start:start + T], rope[1][start:start + T]  # (T, hd) each
        q, k, v = apply_rotary(q, cos, sin, dt), apply_rotary(k, cos, sin, dt), v.to(dt)
        if cache is not None:
            k, v = cache.append(k, v, start)  # (B, nh, START + 1, hd) each
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None,
                                           dropout_p=self.dropout if self.training else 0.0)  # (B, nh, T, hd)
        return self.proj(y.to(qkv.dtype).transpose(1, 2).reshape(B, T, D))  # (B, T, D)


class CrossAttention(nn.Module):
    """Multi-head attention from the tokens to a memory of M positions. Rotary on both sides, the
    memory at positions 0..M-1: the scores depend on the offset between a token and a memory
    position, so a memory aligned with the tokens is easy to read at the token's own position."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0):
        super().__init__()
        self.n_heads, self.head_dim, self.dropout = n_heads, d_model // n_heads, dropout
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.kv = nn.Linear(d_model, 2 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def memory_kv(self, memory: torch.Tensor, rope):
        """memory (B, M, D) -> rotary keys and values (B, nh, M, hd) each: computed once per decoding."""
        B, M, _ = memory.shape
        kv = self.kv(memory).view(B, M, 2, self.n_heads, self.head_dim)  # (B, M, 2, nh, hd)
        k, v = kv.permute(2, 0, 3, 1, 4)  # (B, nh, M, hd) each
        dt = _attn_dtype(memory, kv)
        return apply_rotary(k, rope[0][:M], rope[1][:M], dt), v.to(dt)

    def forward(self, x: torch.Tensor, memory_kv, rope, start: int = 0) -> torch.Tensor:
        """x (B, T, D) at positions START..START+T-1; MEMORY_KV from `memory_kv`. Returns (B, T, D)."""
        B, T, D = x.shape
        qx = self.q(x)  # (B, T, D)
        k, v = memory_kv
        q = qx.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        q = apply_rotary(q, rope[0][start:start + T], rope[1][start:start + T], k.dtype)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)  # (B, nh, T, hd)
        return self.proj(y.to(qx.dtype).transpose(1, 2).reshape(B, T, D))  # (B, T, D)


class CausalCrossBlock(nn.Module):
    """Pre-norm decoder block: x + CausalSelfAttn(RMSNorm(x)), x + CrossAttn(RMSNorm(x), memory),
    then x + MLP(RMSNorm(x)) (the Transformer decoder of Vaswani et al. 2017, pre-norm)."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: float = 4.0, mlp: str = "gelu",
                 dropout: float = 0.0):
        super().__init__()
        self.norm1 = RMSNorm(d_model)
        self.self_attn = CausalSelfAttention(d_model, n_heads, dropout=dropout)
        self.norm2 = RMSNorm(d_model)
        self.cross_attn = CrossAttention(d_model, n_heads, dropout=dropout)
        self.norm3 = RMSNorm(d_model)
        self.mlp = MLP(d_model, mlp_hidden(d_model, mlp_ratio, mlp), kind=mlp)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory_kv, rope, start: int = 0, cache: KVCache | None = None):
        """x (B, T, D) at positions START..; MEMORY_KV from `cross_attn.memory_kv`; CACHE as in
        `CausalSelfAttention`. Returns (B, T, D)."""
        x = x + self.drop(self.self_attn(self.norm1(x), rope, start, cache))  # (B, T, D)
        x = x + self.drop(self.cross_attn(self.norm2(x), memory_kv, rope, start))  # (B, T, D)
        return x + self.drop(self.mlp(self.norm3(x)))  # (B, T, D)
