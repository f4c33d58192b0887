"""Text VAE: token sequences <-> sequences of continuous Gaussian latents.

A variational auto-encoder (Kingma & Welling 2014, "Auto-Encoding Variational Bayes") whose
latent is a *sequence* of small vectors, one per `latent_stride` tokens, the space in which the
DiT denoiser runs (latent diffusion: Rombach et al. 2022; for text: Lovelace et al. 2023,
"Latent Diffusion for Language Generation").

    ids (B, L) ─embed─▶ bidirectional Transformer ─▶ pool k tokens ─▶ mean, logvar (B, L/k, C)
      (or, with a frozen pretrained encoder: ids ─frozen GPT-2 blocks─▶ linear ─▶ the same Transformer)
    z (B, L/k, C) ─linear to k·D, unpool─▶ bidirectional Transformer ─▶ logits (B, L, V)

Design choices (each one matters for the diffusion model that lives in this latent space):

- Fixed-length inputs (B, max_len), right-padded with `pad_id`. The encoder attends over ALL
  positions, pads included: the pads say where the text ends, and the latents at pad positions
  are part of the text's representation. The decoder is non-autoregressive and predicts the pad
  token explicitly, so a latent sequence decodes to a text of its own length: decoded length =
  position of the first pad (`text_lengths`). This is what lets samples stop.
- Reconstruction loss: cross-entropy over all positions. Text tokens and the first pad (the
  end-of-text decision) get weight 1; the trailing pads after it, which are trivially easy and
  never read when decoding, get `pad_weight` (1.0 = plain mean over positions).
- KL(q(z|x) || N(0, I)) per latent dimension, averaged over batch and positions, clamped below
  at `free_bits` nats per dimension (Kingma et al. 2016, "Improved Variational Inference with
  Inverse Autoregressive Flow", §C.8), summed over dimensions and scaled by β. β and its warm-up
  come from the trainer.
- The posterior log-variance starts at `logvar_init` = -8 (σ ≈ 0.02), below the initial spread
  of the means (≈ 0.2): with σ = 1 at init the latents are pure noise, the decoder learns to ignore
  them and training sits on a unigram plateau (figures in docs/RESULTS.md, "Design measurements").
- Robust decoder: the denoiser's x0 estimate is never exact, so during training the decoder sees
  z + N(0, (latent_noise · s)^2), s the per-dimension std of the batch's posterior means (the data
  scale of each latent channel). With latent_noise = 0.1 this is noise at 10% of the data spread,
  well above the posterior noise a small-β VAE learns, so the decoder tolerates small errors.
- Frozen pretrained encoder (`encoder_lm`, seed 004 §3: the encoder half of the VAE taken from a
  pretrained language model and kept fixed): a `tdiff train-ar` GPT-2 cut after its middle block
  reads the ids ([bos] + ids, tdiff pads mapped to the LM's pad) and a trainable linear layer maps
  its features into the VAE's encoder in place of the token embedding. The GPT-2 weights live in
  the VAE (frozen, `encoder_lm.*`), so the artifact stays self-contained.
- Contextual decoder (`decoder="contextual"`; CoDAR, arXiv 2603.02547): the parallel decoder picks
  each position's token on its own, and the choices do not agree with each other. A small causal
  Transformer (`ctx_layers` blocks: causal self-attention, cross-attention to the parallel decoder's
  final states, MLP; it shares `lm_head`) then decodes the tokens one by one, [bos] first
  (`decode_tokens`). It is trained teacher-forced beside the parallel decoder, whose CE stays in the
  loss (it shapes the latents and the memory), on latents noised by up to `ctx_noise` of each
  channel's spread, so it holds up on the denoiser's output.
- `latent_mean` / `latent_std` buffers (set by the trainer from data) normalise latents so the
  denoiser sees zero-mean unit-variance channels: `normalize(z)`, `denormalize(z)`.
  `encode` and `decode` work in the raw (unnormalised) latent space.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from tdiff.data.token_ids import text_lengths  # noqa: F401  (re-exported: the decoded length)
from tdiff.models.decoding import filter_logits, penalize_seen
from tdiff.models.layers import (MAX_LAYERS, Block, CausalCrossBlock, KVCache, RMSNorm, check_keys, check_transformer,
                                 init_weights, require, rotary_cos_sin)

LATENT_STRIDES = (1, 2, 4)
DECODERS = ("parallel", "contextual")   # the latents-to-tokens decoders (VAEConfig.decoder)
MAX_LEN = 65536      # tokens per sequence; a config asking for more is damaged, not a model
# GPT2Config fields a frozen encoder is rebuilt from (stored in the VAE config), and their types.
ENCODER_LM_FIELDS = {"vocab_size": int, "n_positions": int, "n_embd": int, "n_layer": int, "n_head": int,
                     "bos_token_id": int, "pad_token_id": int, "activation_function": str,
                     "layer_norm_epsilon": float}
ENCODER_LM_KEYS = tuple(ENCODER_LM_FIELDS)

# Architecture presets; vocab_size and max_len come from the data, latent_dim/stride from flags.
PRESETS = {
    "tiny": dict(d_model=128, n_layers=2, n_heads=4),   # 0.80M + 2·128·V params (2.8M at V=8000)
    "small": dict(d_model=256, n_layers=4, n_heads=4),  # 6.3M + 2·256·V params (10.4M at V=8000)
    "base": dict(d_model=512, n_layers=6, n_heads=8),   # 37.8M + 2·512·V params (46.0M at V=8000)
}


@dataclass
class VAEConfig:
    vocab_size: int
    max_len: int                   # tokens per (padded) sequence
    d_model: int = 128
    n_layers: int = 2              # encoder layers
    n_heads: int = 4
    n_dec_layers: Optional[int] = None  # decoder layers; None = n_layers
    mlp_ratio: float = 4.0
    mlp: str = "gelu"              # gelu | swiglu
    latent_dim: int = 32           # C, channels per latent position
    latent_stride: int = 1         # k tokens pooled into one latent: 1 | 2 | 4
    pad_id: int = 3
    dropout: float = 0.0
    latent_noise: float = 0.1      # decoder input noise during training, relative to latent std
    pad_weight: float = 1.0        # CE weight of pads after the first one
    logvar_init: float = -8.0      # initial posterior log-variance (bias of the logvar head)
    rope_base: float = 10000.0
    encoder_lm: Optional[dict] = None  # frozen GPT-2 encoder (GPT2Config fields), or None: token embedding
    decoder: str = "parallel"      # parallel | contextual (an autoregressive decoder on the parallel one's states)
    ctx_layers: int = 2            # blocks of the contextual decoder
    ctx_noise: float = 0.5         # its training latents' noise: up to this, relative to the latent std
    bos_id: int = 1                # the contextual decoder's first input token (the tokenizer's [bos])

    def __post_init__(self):
        def need(ok, field, problem):
            require(ok, "VAE", field, problem)

        need(self.vocab_size >= 2, "vocab_size", f"must be >= 2, got {self.vocab_size}")
        need(0 <= self.pad_id < self.vocab_size, "pad_id",
             f"must be a token of the vocabulary (0..{self.vocab_size - 1}), got {self.pad_id}")
        need(self.latent_stride in LATENT_STRIDES, "latent_stride",
             f"must be one of {', '.join(map(str, LATENT_STRIDES))}, got {self.latent_stride}")
        need(1 <= self.max_len <= MAX_LEN and self.max_len % self.latent_stride == 0, "max_len",
             f"must be a multiple of latent_stride ({self.latent_stride}) in 1..{MAX_LEN}, got {self.max_len}")
        check_transformer("VAE", self.d_model, self.n_heads, self.n_layers, self.mlp_ratio, self.mlp,
                          self.dropout, self.rope_base)
        need(self.n_dec_layers is None or 1 <= self.n_dec_layers <= MAX_LAYERS, "n_dec_layers",
             f"must be in 1..{MAX_LAYERS} (or null: n_layers), got {self.n_dec_layers}")
        need(self.latent_dim >= 1, "latent_dim", f"must be >= 1, got {self.latent_dim}")
        need(self.latent_noise >= 0, "latent_noise", f"must be >= 0, got {self.latent_noise}")
        need(self.pad_weight >= 0, "pad_weight", f"must be >= 0, got {self.pad_weight}")
        need(self.decoder in DECODERS, "decoder", f"must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        need(1 <= self.ctx_layers <= MAX_LAYERS, "ctx_layers", f"must be in 1..{MAX_LAYERS}, got {self.ctx_layers}")
        need(self.ctx_noise >= 0, "ctx_noise", f"must be >= 0, got {self.ctx_noise}")
        need(0 <= self.bos_id < self.vocab_size, "bos_id",
             f"must be a token of the vocabulary (0..{self.vocab_size - 1}), got {self.bos_id}")
        if self.encoder_lm is not None:
            self._check_encoder_lm(self.encoder_lm)

    def _check_encoder_lm(self, lm: dict) -> None:
        """The frozen encoder's GPT2Config fields: all of ENCODER_LM_FIELDS, the VAE's vocabulary,
        room for [bos] + max_len positions, a known activation (ConfigError otherwise)."""
        def need(ok, field, problem):
            require(ok, "VAE", f"encoder_lm.{field}", problem)

        for key in ENCODER_LM_FIELDS:
            need(key in lm, key, f"is missing (the frozen encoder needs {', '.join(ENCODER_LM_FIELDS)})")
        for key in lm:
            need(key in ENCODER_LM_FIELDS, key, f"is an unknown key (known: {', '.join(ENCODER_LM_FIELDS)})")
        need(lm["vocab_size"] == self.vocab_size, "vocab_size",
             f"must be the VAE's vocabulary ({self.vocab_size}), got {lm['vocab_size']}")
        need(lm["n_positions"] >= self.max_len + 1, "n_positions",
             f"must be at least max_len + 1 = {self.max_len + 1} (the frozen encoder reads [bos] + the text; "
             f"train it with `train-ar --max-len {self.max_len + 1}` or more), got {lm['n_positions']}")
        need(1 <= lm["n_layer"] <= MAX_LAYERS, "n_layer", f"must be in 1..{MAX_LAYERS}, got {lm['n_layer']}")
        need(lm["n_embd"] >= 1, "n_embd", f"must be >= 1, got {lm['n_embd']}")
        need(lm["n_head"] >= 1 and lm["n_embd"] % lm["n_head"] == 0, "n_head",
             f"must divide n_embd ({lm['n_embd']}), got {lm['n_head']}")
        for key in ("bos_token_id", "pad_token_id"):
            need(0 <= lm[key] < self.vocab_size, key,
                 f"must be a token of the vocabulary (0..{self.vocab_size - 1}), got {lm[key]}")
        need(lm["layer_norm_epsilon"] > 0, "layer_norm_epsilon", f"must be > 0, got {lm['layer_norm_epsilon']}")
        from transformers.activations import ACT2FN

        need(lm["activation_function"] in ACT2FN, "activation_function",
             f"must be an activation transformers knows, got {lm['activation_function']!r}")

    @property
    def dec_layers(self) -> int:
        return self.n_layers if self.n_dec_layers is None else self.n_dec_layers

    @property
    def latent_len(self) -> int:
        """Latent positions per sequence: max_len / latent_stride."""
        return self.max_len // self.latent_stride

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "VAEConfig":
        """Rebuild from `to_dict()` output; unknown keys are an error, not silently dropped."""
        check_keys(cls, d, "VAE")
        return cls(**d)

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VAEConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown VAE preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **overrides})


def _spread(mean: torch.Tensor) -> torch.Tensor:
    """The data spread of each latent channel in a batch of posterior means (B, N, C): std (C,), no gradient."""
    return mean.detach().std(dim=(0, 1), correction=0)


class TextVAE(nn.Module):
    """Transformer VAE over fixed-length padded token sequences: a non-autoregressive decoder, and
    with `decoder="contextual"` an autoregressive one on top of it."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        self.config = c = config
        k, D, C = c.latent_stride, c.d_model, c.latent_dim
        self.head_dim = D // c.n_heads
        # encoder: token embedding, or a frozen pretrained LM and a trainable input map
        if c.encoder_lm is None:
            self.tok_emb = nn.Embedding(c.vocab_size, D)
        else:
            self.lm_in = nn.Linear(c.encoder_lm["n_embd"], D)
        self.enc_blocks = nn.ModuleList(Block(D, c.n_heads, c.mlp_ratio, c.mlp, c.dropout) for _ in range(c.n_layers))
        self.enc_norm = RMSNorm(D)
        self.to_latent = nn.Linear(k * D, 2 * C)  # pooled k tokens -> (mean, logvar)
        # decoder
        self.from_latent = nn.Linear(C, k * D)  # one latent -> k token states
        self.dec_blocks = nn.ModuleList(Block(D, c.n_heads, c.mlp_ratio, c.mlp, c.dropout) for _ in range(c.dec_layers))
        self.dec_norm = RMSNorm(D)
        self.lm_head = nn.Linear(D, c.vocab_size, bias=False)
        if c.decoder == "contextual":  # CoDAR's autoregressive decoder on the states above (`ctx_hidden`)
            self.ctx_emb = nn.Embedding(c.vocab_size, D)
            self.ctx_blocks = nn.ModuleList(CausalCrossBlock(D, c.n_heads, c.mlp_ratio, c.mlp, c.dropout)
                                            for _ in range(c.ctx_layers))
            self.ctx_norm = RMSNorm(D)
        # data statistics of the latent means, set by the trainer (saved with the weights)
        self.register_buffer("latent_mean", torch.zeros(C))
        self.register_buffer("latent_std", torch.ones(C))

        self.apply(init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by 1/sqrt(2·layers)
            if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                depth = c.ctx_layers if name.startswith("ctx_blocks.") else max(c.n_layers, c.dec_layers)
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * depth) ** 0.5)
        with torch.no_grad():  # start with a nearly deterministic posterior (see module docstring)
            self.to_latent.bias[C:].fill_(c.logvar_init)
        if c.encoder_lm is not None:  # built after init_weights: its weights are loaded, never trained
            from transformers import GPT2Config, GPT2Model

            # no eos: the encoder never generates (GPT2Config's default, 50256, lies outside a tdiff vocabulary
            # and draws a transformers warning)
            self.encoder_lm = GPT2Model(GPT2Config(**c.encoder_lm, eos_token_id=None, resid_pdrop=0.0, embd_pdrop=0.0,
                                                   attn_pdrop=0.0))
            self.encoder_lm.requires_grad_(False)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, L) -> encoder input (B, L, D): the token embedding, or the frozen LM's features of
        [bos] + ids (tdiff pads shown as the LM's pad; causal, so right pads change no text position)."""
        if self.config.encoder_lm is None:
            return self.tok_emb(ids)  # (B, L, D)
        lm = self.config.encoder_lm
        x = torch.where(ids == self.config.pad_id, torch.full_like(ids, lm["pad_token_id"]), ids)  # (B, L)
        x = torch.cat([torch.full_like(ids[:, :1], lm["bos_token_id"]), x], dim=1)  # (B, 1 + L)
        with torch.no_grad():
            feats = self.encoder_lm(input_ids=x, use_cache=False).last_hidden_state[:, 1:]  # (B, L, H)
        return self.lm_in(feats)  # (B, L, D)

    # ------------------------------------------------------------ encoder / decoder

    def encode(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (B, L) -> posterior mean, logvar, each (B, L/k, C) in float32 (raw latent space)."""
        B, L = ids.shape
        k = self.config.latent_stride
        if L % k:
            raise ValueError(f"sequence length {L} is not a multiple of latent_stride {k}")
        rope = rotary_cos_sin(L, self.head_dim, self.config.rope_base, ids.device)
        h = self._embed(ids)  # (B, L, D)
        for blk in self.enc_blocks:
            h = blk(h, rope)  # (B, L, D)
        h = self.enc_norm(h).reshape(B, L // k, k * h.shape[-1])  # (B, L/k, k·D)
        mean, logvar = self.to_latent(h).float().chunk(2, dim=-1)  # (B, L/k, C) each
        return mean, logvar.clamp(-30.0, 20.0)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, N, C) raw latents -> logits (B, N·k, V) over the vocabulary, pad included."""
        return self.lm_head(self.decode_hidden(z))  # (B, L, V)

    def decode_hidden(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, N, C) raw latents -> the decoder's final states (B, N·k, D), before the output layer
        (`lm_head`), so that a caller can take the V-way logits a few rows at a time."""
        B, N, _ = z.shape
        k, D = self.config.latent_stride, self.config.d_model
        h = self.from_latent(z.to(self.from_latent.weight.dtype)).reshape(B, N * k, D)  # (B, L, D)
        rope = rotary_cos_sin(N * k, self.head_dim, self.config.rope_base, z.device)
        for blk in self.dec_blocks:
            h = blk(h, rope)  # (B, L, D)
        return self.dec_norm(h)  # (B, L, D)

    # ------------------------------------------------------------ contextual decoder (CoDAR)

    def ctx_hidden(self, prev: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """The contextual decoder, teacher-forced: input tokens PREV (B, T) ([bos], then token i-1 at
        position i) and the parallel decoder's states MEMORY (B, L, D), T <= L -> final states (B, T, D)
        for `lm_head` (position i predicts token i; causal: it sees PREV[:, :i+1] and the whole memory).
        `decode_tokens` runs the same network one position at a time."""
        T, L = prev.shape[1], memory.shape[1]
        rope = rotary_cos_sin(L, self.head_dim, self.config.rope_base, memory.device)
        kv = [blk.cross_attn.memory_kv(memory, rope) for blk in self.ctx_blocks]
        h = self.ctx_emb(prev) + memory[:, :T]  # (B, T, D): see `decode_tokens`
        for blk, m in zip(self.ctx_blocks, kv):
            h = blk(h, m, rope)  # (B, T, D)
        return self.ctx_norm(h)  # (B, T, D)

    @torch.no_grad()
    def decode_tokens(self, z: torch.Tensor, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                      generator=None, must_text=None, banned=None, known_ids=None, known_mask=None,
                      repetition_penalty: float = 1.0) -> torch.Tensor:
        """z (B, N, C) raw latents -> token ids (B, L), decoded token by token by the contextual decoder.

        CoDAR (arXiv 2603.02547): rounding latents to tokens position by position is the bottleneck
        of continuous text diffusion (the per-position choices do not agree with each other); a small
        autoregressive decoder conditioned on the denoised latents fixes it. Here its memory is the
        parallel decoder's final states `decode_hidden(z)` (B, L, D), aligned with the tokens: each
        block cross-attends to it, and the state at a token's own position is added to its input, so
        the residual stream starts where the parallel decoder ends and the shared `lm_head` reads it.

        Each step's logits are filtered as `filter_logits` does (argmax at temperature 0); the
        REPETITION_PENALTY lowers the tokens already in the row (CTRL). Where MUST_TEXT (B, L) is true
        the BANNED (V,) ids (default: pad and bos) are excluded; where KNOWN_MASK (B, L) is true the
        token is KNOWN_IDS (forced into the context: prompts and infills steer the rest). A row that
        emits pad is finished (pads from there, known tokens kept); decoding stops when every row is.
        Self-attention keys and values are cached; the memory's are computed once per layer."""
        c = self.config
        if c.decoder != "contextual":
            raise ValueError("decode_tokens needs a VAE with the contextual decoder")
        memory = self.decode_hidden(z)  # (B, L, D)
        B, L, _ = memory.shape
        dev = memory.device
        rope = rotary_cos_sin(L, self.head_dim, c.rope_base, dev)
        kv = [blk.cross_attn.memory_kv(memory, rope) for blk in self.ctx_blocks]
        caches = [KVCache(L) for _ in self.ctx_blocks]
        vocab = self.lm_head.out_features
        if banned is None:
            banned = torch.zeros(vocab, dtype=torch.bool, device=dev)  # (V,)
            banned[[c.pad_id, c.bos_id]] = True
        pad = torch.full((B,), c.pad_id, dtype=torch.long, device=dev)  # (B,)
        out = pad[:, None].repeat(1, L)  # (B, L)
        if known_mask is not None:
            out = torch.where(known_mask, known_ids, out)  # (B, L): known tokens even past an early stop
        seen = torch.zeros(B, vocab, dtype=torch.bool, device=dev)  # (B, V) tokens in the row so far
        done = torch.zeros(B, dtype=torch.bool, device=dev)  # (B,)
        prev = torch.full((B,), c.bos_id, dtype=torch.long, device=dev)  # (B,)
        for i in range(L):
            h = self.ctx_emb(prev)[:, None] + memory[:, i:i + 1]  # (B, 1, D)
            for blk, m, cache in zip(self.ctx_blocks, kv, caches):
                h = blk(h, m, rope, start=i, cache=cache)  # (B, 1, D)
            logits = penalize_seen(self.lm_head(self.ctx_norm(h))[:, 0].float(), seen, repetition_penalty)  # (B, V)
            if must_text is not None:
                logits = logits.masked_fill(must_text[:, i, None] & banned[None, :], float("-inf"))
            tok = torch.where(done, pad, filter_logits(logits, temperature, top_k, top_p, generator))  # (B,)
            if known_mask is not None:
                tok = torch.where(known_mask[:, i], known_ids[:, i], tok)  # (B,)
            out[:, i] = tok
            seen[torch.arange(B, device=dev), tok] = True
            done |= tok == c.pad_id
            if bool(done.all()):
                break
            prev = tok
        return out

    def _contextual_loss(self, z: torch.Tensor, mean: torch.Tensor, ids: torch.Tensor,
                         counted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(teacher-forced CE of the contextual decoder over the COUNTED (B, L) positions: the text
        and the first pad, its accuracy there) on latents Z (B, N, C). In training the latents are
        noised first, z + r·s·ε with s the spread of each channel of MEAN and r ~ U[0, ctx_noise] per
        row, so that the decoder holds up on what the denoiser produces."""
        B, L = ids.shape
        if self.training and self.config.ctx_noise > 0:
            r = self.config.ctx_noise * torch.rand(B, 1, 1, device=z.device)  # (B, 1, 1)
            z = z + r * _spread(mean) * torch.randn_like(z)  # (B, N, C)
        prev = torch.cat([torch.full_like(ids[:, :1], self.config.bos_id), ids[:, :-1]], dim=1)  # (B, L)
        logits = self.lm_head(self.ctx_hidden(prev, self.decode_hidden(z))).float()  # (B, L, V)
        ce = F.cross_entropy(logits.reshape(B * L, -1), ids.reshape(B * L), reduction="none").view(B, L)
        ctx_rec = (ce * counted).sum() / counted.sum()
        with torch.no_grad():
            acc = ((logits.argmax(-1) == ids) & counted).sum().float() / counted.sum()
        return ctx_rec, acc

    # ------------------------------------------------------------ training loss

    def forward(self, ids: torch.Tensor, beta: float = 0.0, free_bits: float = 0.0,
                sample: bool = True) -> dict:
        """Negative ELBO with β and free bits. ids (B, L) padded with pad_id.

        Returns dict: loss (with grad) = rec + beta·kl; rec = weighted token CE (nats);
        kl = free-bits-clamped KL per latent position (nats, summed over channels: the term in
        the loss); kl_raw = unclamped KL; acc = token accuracy over text positions and the first
        pad; len_acc = fraction of rows whose decoded length is exact; mean = the posterior mean
        (B, N, C), with its graph (for an alignment loss). All but loss and mean are detached.

        With the contextual decoder the loss adds its teacher-forced CE (`_contextual_loss`), reported
        as ctx_rec, with its teacher-forced accuracy ctx_acc; rec and acc stay the parallel decoder's.
        """
        mean, logvar = self.encode(ids)  # (B, N, C) each
        z = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean) if sample else mean
        noisy = z
        if self.training and self.config.latent_noise > 0:
            noisy = z + self.config.latent_noise * _spread(mean) * torch.randn_like(z)  # (B, N, C)
        logits = self.decode(noisy)  # (B, L, V)

        B, L = ids.shape
        lengths = text_lengths(ids, self.config.pad_id)  # (B,)
        pos = torch.arange(L, device=ids.device)
        counted = pos[None, :] <= lengths[:, None]  # (B, L): text tokens + the first pad
        weight = torch.where(counted, 1.0, self.config.pad_weight)  # (B, L)
        logits = logits.float()  # one float32 copy under autocast, shared by the loss and argmax
        ce = F.cross_entropy(logits.reshape(B * L, -1), ids.reshape(B * L), reduction="none").view(B, L)
        rec = (ce * weight).sum() / weight.sum()

        kl_dim = 0.5 * (mean.pow(2) + logvar.exp() - 1.0 - logvar).mean(dim=(0, 1))  # (C,)
        kl = kl_dim.clamp(min=free_bits).sum()  # free bits: no pressure below free_bits per channel
        loss = rec + beta * kl

        with torch.no_grad():
            pred = logits.argmax(-1)  # (B, L)
            acc = ((pred == ids) & counted).sum().float() / counted.sum()
            len_acc = (text_lengths(pred, self.config.pad_id) == lengths).float().mean()
        out = dict(loss=loss, rec=rec.detach(), kl=kl.detach(), kl_raw=kl_dim.sum().detach(),
                   acc=acc, len_acc=len_acc, mean=mean)
        if self.config.decoder == "contextual":
            ctx_rec, ctx_acc = self._contextual_loss(z, mean, ids, counted)
            out.update(loss=loss + ctx_rec, ctx_rec=ctx_rec.detach(), ctx_acc=ctx_acc)
        return out

    # ------------------------------------------------------------ helpers

    @torch.no_grad()
    def decode_ids(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, N, C) raw latents -> greedy token ids (B, L): the parallel decoder's argmax, or with
        the contextual decoder its free-running greedy decoding (what sampling produces; teacher
        forcing would flatter it)."""
        if self.config.decoder == "contextual":
            return self.decode_tokens(z)
        return self.decode(z).argmax(-1)

    @torch.no_grad()
    def reconstruct(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, L) -> greedy decoding (`decode_ids`) of the posterior mean, (B, L)."""
        mean, _ = self.encode(ids)
        return self.decode_ids(mean)

    @torch.no_grad()
    def token_accuracy(self, ids: torch.Tensor) -> float:
        """Reconstruction accuracy over text tokens and the first pad (the end-of-text decision)."""
        pred = self.reconstruct(ids)
        lengths = text_lengths(ids, self.config.pad_id)
        counted = torch.arange(ids.shape[1], device=ids.device)[None, :] <= lengths[:, None]
        return (((pred == ids) & counted).sum() / counted.sum()).item()

    def normalize(self, z: torch.Tensor) -> torch.Tensor:
        """Raw latents -> zero-mean, unit-variance channels (what the denoiser sees)."""
        return (z - self.latent_mean.to(z.dtype)) / self.latent_std.to(z.dtype)

    def denormalize(self, z: torch.Tensor) -> torch.Tensor:
        """Inverse of `normalize`: denoiser space -> raw latents for `decode`."""
        return z * self.latent_std.to(z.dtype) + self.latent_mean.to(z.dtype)

    @torch.no_grad()
    def set_latent_stats(self, mean: torch.Tensor, std: torch.Tensor, min_std: float = 1e-6) -> None:
        """Store per-channel statistics of posterior means (C,) measured on training data."""
        self.latent_mean.copy_(mean.reshape(-1))
        self.latent_std.copy_(std.reshape(-1).clamp(min=min_std))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def load_encoder_lm(self, lm_state: dict) -> None:
        """Copy a GPT-2's transformer weights (GPT2LMHeadModel.transformer.state_dict()) into the
        frozen encoder; blocks beyond the encoder's depth are ignored."""
        own = self.encoder_lm.state_dict()
        missing = sorted(k for k in own if k not in lm_state)
        if missing:
            raise ValueError(f"frozen encoder: the language model lacks {', '.join(missing[:3])}")
        self.encoder_lm.load_state_dict({k: lm_state[k] for k in own})
