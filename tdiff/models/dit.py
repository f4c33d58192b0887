"""DiT: the Diffusion Transformer denoiser over VAE latent sequences.

Peebles & Xie 2023, "Scalable Diffusion Models with Transformers": a Transformer whose blocks are
conditioned on the timestep (and class label) through adaLN-Zero, i.e. adaptive layer norm whose
shift / scale / gate are regressed from the conditioning vector and zero-initialised so that every
block starts as the identity and the network's output starts at exactly zero. Adapted to text
latents (B, N, C) instead of image patches:

- Input: concat[x_t, self-conditioning x0 estimate, known clean latents, known-mask] -> d_model.
  Self-conditioning (Chen et al. 2023, "Analog Bits", §3.2) feeds the previous x0 estimate back
  in (zeros when absent). The span-mask channel (cond_x, cond_mask: 1 where a position is given)
  lets one network do unconditional generation, prefix prompting, infilling and editing.
- Position: rotary embeddings in self-attention (Su et al. 2021) plus a learned absolute position
  embedding (`abs_pos`). Sequences are fixed-length with pads at the end, so absolute position
  carries real information (how likely is position n to be past the end of the text?) that relative
  attention alone would have to infer from boundary effects.
- Time: continuous t ∈ [0, 1], scaled by 1000 and embedded with DiT's sinusoidal features -> MLP.
- Labels: `num_labels` classes plus one "null" class (index num_labels) for classifier-free
  guidance (Ho & Salimans 2022); label -1 or None means null. Label dropout is the trainer's job.
- Output: the raw network output (B, N, C). Whether it means x0, eps or v is decided by the
  diffusion process code (tdiff/diffusion), not here: network ≠ process.

There is no padding mask: latent sequences are fixed length and pads are part of the text.

Block-causal mode (`block_size` B < max_len; Arriola et al. 2025, "Block Diffusion", BD3-LM, §3,
in latent space): the N positions form ⌈N/B⌉ blocks, each noised at its own time t_k. A noisy block
attends to itself and to the *clean* blocks before it; `forward_blocks` trains every block in one
pass over the 2N-token sequence [x_t ; x0] under the mask of BD3-LM's eq. 6 (noisy↔same noisy
block, noisy→earlier clean blocks, clean→clean blocks up to its own), and sampling runs block by
block: `forward_cached` denoises one block against the keys/values of the finished blocks, which
`extend_cache` appends (their clean latents at t = 0). B = max_len is the fully parallel model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from tdiff.models.layers import MLP, Attention, check_keys, check_transformer, mlp_hidden, require, rotary_cos_sin

# Architecture presets; latent_dim and max_len come from the VAE.
PRESETS = {
    "tiny": dict(d_model=128, n_layers=4, n_heads=4),   # 1.3M params (latent_dim 32, max_len 128)
    "small": dict(d_model=256, n_layers=6, n_heads=4),  # 7.4M params
    "base": dict(d_model=512, n_layers=8, n_heads=8),   # 38.9M params
}


@dataclass
class DiTConfig:
    latent_dim: int = 32           # C, channels per latent position (the VAE's latent_dim)
    max_len: int = 128             # N, latent positions (the VAE's max_len / latent_stride)
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: float = 4.0
    mlp: str = "gelu"              # gelu | swiglu
    num_labels: int = 0            # 0 = unconditional; else classes 0..num_labels-1 (+ null)
    self_condition: bool = True    # input channels for the previous x0 estimate
    cond_channels: bool = True     # input channels for known clean latents + their mask
    abs_pos: bool = True           # learned absolute position embedding (in addition to rotary)
    dropout: float = 0.0
    rope_base: float = 10000.0
    time_freq_dim: int = 256       # sinusoidal timestep features
    time_scale: float = 1000.0     # t ∈ [0, 1] is embedded as t · time_scale
    block_size: int = 0            # latent positions per block of block-causal diffusion; 0: max_len (parallel)

    def __post_init__(self):
        def need(ok, field, problem):
            require(ok, "DiT", field, problem)

        need(self.latent_dim >= 1, "latent_dim", f"must be >= 1, got {self.latent_dim}")
        need(self.max_len >= 1, "max_len", f"must be >= 1, got {self.max_len}")
        check_transformer("DiT", self.d_model, self.n_heads, self.n_layers, self.mlp_ratio, self.mlp,
                          self.dropout, self.rope_base)
        need(self.num_labels >= 0, "num_labels", f"must be >= 0, got {self.num_labels}")
        need(self.time_freq_dim >= 2 and self.time_freq_dim % 2 == 0, "time_freq_dim",
             f"must be even and >= 2, got {self.time_freq_dim}")
        need(self.time_scale > 0, "time_scale", f"must be > 0, got {self.time_scale}")
        need(0 <= self.block_size <= self.max_len, "block_size",
             f"must be in 1..max_len ({self.max_len}) (or 0: max_len), got {self.block_size}")

    @property
    def block(self) -> int:
        """Latent positions per block (max_len for the fully parallel model)."""
        return self.block_size or self.max_len

    @property
    def block_causal(self) -> bool:
        return self.block < self.max_len

    @property
    def in_channels(self) -> int:
        C = self.latent_dim
        return C + (C if self.self_condition else 0) + (C + 1 if self.cond_channels else 0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "DiTConfig":
        """Rebuild from `to_dict()` output; unknown keys are an error, not silently dropped."""
        check_keys(cls, d, "DiT")
        return cls(**d)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "DiTConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown DiT preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features of (scaled) timesteps t (B,) -> (B, dim) float32 (DiT / Vaswani et al. 2017)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None, :]  # (B, dim/2)
    return torch.cat((torch.cos(args), torch.sin(args)), dim=-1)  # (B, dim)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x (B, N, D) * (1 + scale (B, 1, D)) + shift (B, 1, D)."""
    return x * (1 + scale) + shift


class DiTBlock(nn.Module):
    """Transformer block with adaLN-Zero conditioning (Peebles & Xie 2023, Fig. 3)."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: float = 4.0, mlp: str = "gelu",
                 dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(d_model, n_heads, dropout=dropout, bias=True)
        self.norm2 = nn.LayerNorm(d_model, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(d_model, mlp_hidden(d_model, mlp_ratio, mlp), kind=mlp, bias=True)
        self.drop = nn.Dropout(dropout)
        # c -> shift, scale, gate for attention and MLP; zero-init so the block starts as identity.
        # The SiLU of DiT's adaLN_modulation is applied once to c by the caller.
        self.adaLN = nn.Linear(d_model, 6 * d_model)

    def forward(self, x: torch.Tensor, c_act: torch.Tensor, rope, *, index: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, past=None, keep_kv: bool = False):
        """x (B, N, D); c_act = SiLU(conditioning) (B, D), or (B, K, D) with INDEX (N,) naming each
        position's row of it (per-block times); rope = (cos, sin) of x's positions; MASK (N, P + N)
        bool, True = may attend; PAST = (k, v) (B, nh, P, hd) of earlier positions. Returns x, or
        (x, (k, v) of x's positions) with KEEP_KV."""
        mod = self.adaLN(c_act)                                   # (B, 6D) or (B, K, 6D)
        mod = mod[:, None, :] if index is None else mod[:, index]  # (B, 1 or N, 6D)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.chunk(6, dim=-1)  # (B, 1 or N, D)
        a = self.attn.attend(modulate(self.norm1(x), shift_a, scale_a), rope, mask=mask, past=past, keep_kv=keep_kv)
        a, kv = a if keep_kv else (a, None)
        x = x + gate_a * self.drop(a)  # (B, N, D)
        x = x + gate_m * self.drop(self.mlp(modulate(self.norm2(x), shift_m, scale_m)))  # (B, N, D)
        return (x, kv) if keep_kv else x


class FinalLayer(nn.Module):
    """adaLN (shift, scale) + zero-initialised linear to the latent channels."""

    def __init__(self, d_model: int, out_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, elementwise_affine=False, eps=1e-6)
        self.adaLN = nn.Linear(d_model, 2 * d_model)
        self.linear = nn.Linear(d_model, out_dim)

    def forward(self, x: torch.Tensor, c_act: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        mod = self.adaLN(c_act)
        shift, scale = (mod[:, None, :] if index is None else mod[:, index]).chunk(2, dim=-1)  # (B, 1 or N, D)
        return self.linear(modulate(self.norm(x), shift, scale))  # (B, N, C)


class DiT(nn.Module):
    """Diffusion Transformer over latent sequences (B, N, latent_dim)."""

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = c = config
        D = c.d_model
        self.head_dim = D // c.n_heads
        self.in_proj = nn.Linear(c.in_channels, D)
        self.pos_emb = nn.Parameter(torch.zeros(c.max_len, D)) if c.abs_pos else None
        self.t_mlp = nn.Sequential(nn.Linear(c.time_freq_dim, D), nn.SiLU(), nn.Linear(D, D))
        self.label_emb = nn.Embedding(c.num_labels + 1, D) if c.num_labels > 0 else None  # last = null
        self.blocks = nn.ModuleList(DiTBlock(D, c.n_heads, c.mlp_ratio, c.mlp, c.dropout) for _ in range(c.n_layers))
        self.final = FinalLayer(D, c.latent_dim)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """DiT's initialisation: xavier-uniform linears, N(0, 0.02) embeddings, zero adaLN and output."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb, std=0.02)
        if self.label_emb is not None:
            nn.init.normal_(self.label_emb.weight, std=0.02)
        nn.init.normal_(self.t_mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_mlp[2].weight, std=0.02)
        for blk in self.blocks:  # adaLN-Zero: gates (and shifts/scales) start at 0 -> identity blocks
            nn.init.zeros_(blk.adaLN.weight)
            nn.init.zeros_(blk.adaLN.bias)
        for lin in (self.final.adaLN, self.final.linear):  # output starts at exactly 0
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x_t: torch.Tensor, t, *, self_cond: torch.Tensor | None = None,
                label: torch.Tensor | None = None, cond_x: torch.Tensor | None = None,
                cond_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Raw network output (B, N, C), in x_t's dtype; every position attends to every other.

        x_t (B, N, C) noisy latents; t (B,) or scalar, continuous in [0, 1];
        self_cond (B, N, C) previous x0 estimate or None (zeros);
        label (B,) long, -1 = null class, or None (all null);
        cond_x (B, N, C) clean latents of the known positions (other positions are ignored);
        cond_mask (B, N, 1) or (B, N), 1 where the position is known; None = nothing known.
        """
        B, N, _ = x_t.shape
        h = self.embed(x_t, 0, self_cond=self_cond, cond_x=cond_x, cond_mask=cond_mask)  # (B, N, D)
        c_act = F.silu(self.conditioning(t, label, B, x_t.device))  # (B, D), shared by every adaLN
        rope = rotary_cos_sin(N, self.head_dim, self.config.rope_base, x_t.device)
        for blk in self.blocks:
            h = blk(h, c_act, rope)  # (B, N, D)
        return self.final(h, c_act).to(x_t.dtype)  # (B, N, C)

    # ------------------------------------------------------------ pieces shared by the three forwards

    def embed(self, x_t: torch.Tensor, start: int, *, self_cond=None, cond_x=None, cond_mask=None) -> torch.Tensor:
        """Input channels of x_t (B, T, C) at latent positions start..start+T → (B, T, D), with the
        absolute position embedding added."""
        c = self.config
        B, T, _ = x_t.shape
        if c.abs_pos and start + T > c.max_len:
            raise ValueError(f"latent sequence of {start + T} positions exceeds the model's max_len {c.max_len}")
        parts = [x_t]
        if c.self_condition:
            parts.append(torch.zeros_like(x_t) if self_cond is None else self_cond.to(x_t.dtype))
        elif self_cond is not None:
            raise ValueError("self_cond given but the model was built with self_condition=False")
        if c.cond_channels:
            if cond_mask is None:
                if cond_x is not None:
                    raise ValueError("cond_x needs cond_mask (1 where a position is known)")
                parts += [torch.zeros_like(x_t), x_t.new_zeros(B, T, 1)]
            else:
                m = (cond_mask[..., None] if cond_mask.dim() == 2 else cond_mask).to(x_t.dtype)  # (B, T, 1)
                known = torch.zeros_like(x_t) if cond_x is None else cond_x.to(x_t.dtype) * m
                parts += [known, m]
        elif cond_x is not None or cond_mask is not None:
            raise ValueError("cond_x/cond_mask given but the model was built with cond_channels=False")
        h = self.in_proj(torch.cat(parts, dim=-1).to(self.in_proj.weight.dtype))  # (B, T, D)
        if self.pos_emb is not None:
            h = h + self.pos_emb[start:start + T]  # (B, T, D)
        return h

    def embed_clean(self, x0: torch.Tensor, start: int) -> torch.Tensor:
        """A clean block's input (B, T, D): x0 as x_t, as its own x0 estimate and as known latents
        (mask 1): what a fully known span looks like to the network."""
        ones = x0.new_ones(*x0.shape[:2], 1)
        return self.embed(x0, start, self_cond=x0 if self.config.self_condition else None,
                          cond_x=x0 if self.config.cond_channels else None,
                          cond_mask=ones if self.config.cond_channels else None)

    def conditioning(self, t, label, B: int, device) -> torch.Tensor:
        """Time (and label) conditioning before the SiLU: t (B,), (B, K) or scalar → (B, D) or (B, K, D)."""
        c = self.config
        dtype = self.in_proj.weight.dtype
        t = torch.as_tensor(t, device=device)
        t = t.reshape(-1).expand(B) if t.dim() < 2 else t  # (B,) or (B, K): a scalar is broadcast
        emb = timestep_embedding(t.reshape(-1) * c.time_scale, c.time_freq_dim).to(dtype)  # (B·K, F)
        cond = self.t_mlp(emb).reshape(*t.shape, -1)  # (B, D) or (B, K, D)
        if self.label_emb is not None:
            if label is None:
                label = torch.full((B,), c.num_labels, dtype=torch.long, device=device)
            else:
                label = torch.as_tensor(label, device=device).long().reshape(-1).expand(B)
                label = torch.where(label < 0, torch.full_like(label, c.num_labels), label)
            lab = self.label_emb(label)  # (B, D)
            cond = cond + (lab if cond.dim() == 2 else lab[:, None, :])
        elif label is not None:
            raise ValueError("label given but the model was built with num_labels=0")
        return cond

    def block_ids(self, n: int, device) -> torch.Tensor:
        """Block index of each of N latent positions (N,) long."""
        return torch.arange(n, device=device) // self.config.block

    def block_mask(self, n: int, device) -> torch.Tensor:
        """BD3-LM's training mask (eq. 6) over [noisy (N) ; clean (N)] → (2N, 2N) bool, True = may attend:
        noisy→noisy of its own block, noisy→clean of earlier blocks, clean→clean of its block and earlier."""
        b = self.block_ids(n, device)
        same = b[:, None] == b[None, :]          # (N, N)
        before = b[:, None] > b[None, :]         # (N, N) key block strictly earlier
        upto = b[:, None] >= b[None, :]          # (N, N)
        top = torch.cat([same, before], dim=1)   # (N, 2N) noisy queries
        bottom = torch.cat([torch.zeros_like(same), upto], dim=1)  # (N, 2N) clean queries
        return torch.cat([top, bottom], dim=0)   # (2N, 2N)

    # ------------------------------------------------------------ block-causal diffusion

    def forward_blocks(self, x_t: torch.Tensor, t: torch.Tensor, x0: torch.Tensor, *, self_cond=None,
                       label=None, cond_x=None, cond_mask=None) -> torch.Tensor:
        """Vectorised training of every block at once (BD3-LM §3.2): raw output (B, N, C) for the noisy
        blocks x_t (B, N, C), block k noised at time t[:, k] (t (B, K)), each seeing the clean latents
        x0 (B, N, C) of the blocks before it. Other arguments as `forward`."""
        B, N, _ = x_t.shape
        K = t.shape[1]
        h = torch.cat([self.embed(x_t, 0, self_cond=self_cond, cond_x=cond_x, cond_mask=cond_mask),
                       self.embed_clean(x0, 0)], dim=1)  # (B, 2N, D)
        t_all = torch.cat([t, t.new_zeros(B, 1)], dim=1)  # (B, K + 1): the blocks' times, then t = 0
        c_act = F.silu(self.conditioning(t_all, label, B, x_t.device))  # (B, K + 1, D)
        b = self.block_ids(N, x_t.device)
        index = torch.cat([b, torch.full_like(b, K)])  # (2N,) row of c_act of each position
        cos, sin = rotary_cos_sin(N, self.head_dim, self.config.rope_base, x_t.device)
        rope = (torch.cat([cos, cos]), torch.cat([sin, sin]))  # (2N, hd): a clean copy sits at its own position
        mask = self.block_mask(N, x_t.device)
        for blk in self.blocks:
            h = blk(h, c_act, rope, index=index, mask=mask)  # (B, 2N, D)
        return self.final(h[:, :N], c_act, index[:N]).to(x_t.dtype)  # (B, N, C)

    def forward_cached(self, x_t: torch.Tensor, t, start: int, cache: list, *, self_cond=None, label=None,
                       cond_x=None, cond_mask=None) -> torch.Tensor:
        """Raw output (B, T, C) for one noisy block x_t (B, T, C) at latent positions start..start+T, at
        time t (B,) or scalar, attending to itself and to CACHE: per layer the (k, v) of the clean
        blocks before it (`extend_cache`; [] or Nones for the first block)."""
        B, T, _ = x_t.shape
        h = self.embed(x_t, start, self_cond=self_cond, cond_x=cond_x, cond_mask=cond_mask)  # (B, T, D)
        c_act = F.silu(self.conditioning(t, label, B, x_t.device))  # (B, D)
        rope = self._rope(start, T, x_t.device)
        for i, blk in enumerate(self.blocks):
            h = blk(h, c_act, rope, past=cache[i] if cache else None)  # (B, T, D)
        return self.final(h, c_act).to(x_t.dtype)  # (B, T, C)

    def extend_cache(self, x0: torch.Tensor, start: int, cache: list, label=None) -> list:
        """CACHE with the clean block x0 (B, T, C) at positions start..start+T appended (t = 0; it
        attends to the cached blocks and itself, as in `forward_blocks`). Returns the new cache."""
        B, T, _ = x0.shape
        h = self.embed_clean(x0, start)  # (B, T, D)
        c_act = F.silu(self.conditioning(0.0, label, B, x0.device))  # (B, D)
        rope = self._rope(start, T, x0.device)
        out = []
        for i, blk in enumerate(self.blocks):
            past = cache[i] if cache else None
            h, (k, v) = blk(h, c_act, rope, past=past, keep_kv=True)  # (B, T, D); (B, nh, T, hd)
            out.append((k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)))
        return out

    def _rope(self, start: int, T: int, device):
        cos, sin = rotary_cos_sin(start + T, self.head_dim, self.config.rope_base, device)
        return cos[start:], sin[start:]  # (T, hd) each

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
