"""Train the text VAE and write a self-contained `vae` artifact (tokenizer and latent statistics inside).

With `--align DIR` (a `tdiff train-ar` directory made with the same tokenizer) the latents are
also aligned to a frozen language model, REPA-style (Yu et al. 2025, "Representation alignment
for generation", eq. 3, here on the VAE's latents as in latent text diffusion with a pretrained
encoder): a linear probe from each posterior mean to the LM's features at the middle block
(averaged over the latent's tokens) is trained with the VAE, and
`--align-weight` × (1 − cosine similarity) over text positions joins the loss. The probe
exists only in training; the VAE artifact is the same kind of file as without it.

With `--encoder DIR` (a `tdiff train-ar` directory, same tokenizer) the encoder reads the frozen
LM's features instead of a token embedding (seed 004 §3, a frozen pretrained encoder): the LM is
cut after its middle block (as for `--align`), copied into the VAE and never updated; a linear
map and the VAE's own encoder blocks on top of it, and the decoder, are trained as usual.

With `--decoder contextual` the VAE also has a small autoregressive decoder on top of the parallel
one (CoDAR; tdiff/models/vae.py), trained with it: its teacher-forced CE joins the loss (logged as
ctx_rec, its accuracy ctx_acc), and the held-out reconstruction figures decode with it, free-running.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from tdiff.core import log
from tdiff.data import token_ids as D
from tdiff.core.errors import UsageError
from tdiff.data.latents import latent_stats, reconstruction_metrics
from tdiff.formats.model import save_vae
from tdiff.training import distributed
from tdiff.training.loop import LoopConfig, Trainer


@dataclass
class VAETrainConfig:
    preset: str = "tiny"
    latent_dim: int = 32
    latent_stride: int = 1
    max_len: int = 0               # 0: the 99th percentile of training lengths, rounded up
    beta: float = 1e-3             # KL weight after warm-up
    kl_warmup: int = 500           # steps of linear β warm-up from 0
    free_bits: float = 0.1         # nats per latent dimension
    latent_noise: float = 0.1      # decoder-input noise in training, relative to each channel's spread
    d_model: int = 0               # 0: the preset's width
    n_layers: int = 0              # 0: the preset's encoder (and decoder) depth
    align: str = ""                # train-ar directory to align the latents to ("": off)
    align_weight: float = 0.5      # weight of 1 − cos(probe(latent), LM features)
    encoder: str = ""              # train-ar directory whose frozen middle-block features feed the encoder
    decoder: str = "parallel"      # parallel | contextual (an autoregressive decoder on top: CoDAR)
    ctx_layers: int = 2            # blocks of the contextual decoder
    batch_size: int = 64
    holdout: float = 0.02
    loop: LoopConfig = field(default_factory=LoopConfig)


def auto_max_len(seqs, stride: int, cap: int = 512) -> int:
    """99th-percentile length + 1 (room for the pad that marks the end), rounded up to a multiple of 8·stride."""
    q = D.length_percentile(seqs, 0.99) + 1
    m = 8 * stride
    return min(cap, max(m, -(-q // m) * m))


def build_vae(tc: VAETrainConfig, vocab_size: int, pad_id: int, max_len: int, encoder_lm: dict | None = None,
              bos_id: int = 1):
    from tdiff.models.layers import MAX_LAYERS
    from tdiff.models.vae import DECODERS, PRESETS, TextVAE, VAEConfig

    if tc.preset not in PRESETS:
        raise UsageError(f"--preset {tc.preset!r}: choose one of {', '.join(PRESETS)}")
    if tc.latent_stride not in (1, 2, 4):
        raise UsageError("--latent-stride must be 1, 2 or 4")
    if tc.decoder not in DECODERS:
        raise UsageError(f"--decoder {tc.decoder!r}: choose one of {', '.join(DECODERS)}")
    if not 1 <= tc.ctx_layers <= MAX_LAYERS:
        raise UsageError(f"--ctx-layers {tc.ctx_layers}: must be in 1..{MAX_LAYERS}")
    size = {k: v for k, v in (("d_model", tc.d_model), ("n_layers", tc.n_layers)) if v}
    try:
        cfg = VAEConfig(**{**PRESETS[tc.preset], **size, "vocab_size": vocab_size, "max_len": max_len,
                           "latent_dim": tc.latent_dim, "latent_stride": tc.latent_stride, "pad_id": pad_id,
                           "latent_noise": tc.latent_noise, "encoder_lm": encoder_lm, "decoder": tc.decoder,
                           "ctx_layers": tc.ctx_layers, "bos_id": bos_id})
    except ValueError as e:
        raise UsageError(f"{'--encoder' if encoder_lm and 'encoder' in str(e) else '--d-model/--n-layers'}: {e}") from None
    return TextVAE(cfg)


def _frozen_encoder(tc: VAETrainConfig, tok, device):
    """(GPT2Config fields of the frozen encoder, its weights) from --encoder DIR, or (None, None)."""
    if not tc.encoder:
        return None, None
    from tdiff.formats.ar_dir import load_ar
    from tdiff.models.vae import ENCODER_LM_KEYS

    lm, lm_tok = load_ar(tc.encoder, "cpu")
    if lm_tok.to_bytes() != tok.to_bytes():
        raise UsageError(f"--encoder {tc.encoder}: its tokenizer differs from --tokenizer (use a model trained "
                         "on the same token ids)")
    cfg = {k: getattr(lm.config, k) for k in ENCODER_LM_KEYS} | {"n_layer": max(1, lm.config.n_layer // 2)}
    return cfg, lm.transformer.state_dict()


def _with_aligner(vae, tok, tc: VAETrainConfig, device):
    """(module to train, alignment loss or None): without --align the VAE itself; with it, the VAE
    and the probe as one module, and align(ids (B, L), mean (B, N, C)) -> scalar 1 − mean cosine."""
    if not tc.align:
        return vae, None
    import torch.nn as nn
    import torch.nn.functional as F

    from tdiff.models.ar import hidden_states
    from tdiff.formats.ar_dir import load_ar

    lm, lm_tok = load_ar(tc.align, device)
    if lm_tok.to_bytes() != tok.to_bytes():
        raise UsageError(f"--align {tc.align}: its tokenizer differs from --tokenizer (align to a model "
                         "trained on the same token ids)")
    lm.requires_grad_(False)
    layer = max(1, lm.config.n_layer // 2)
    module = nn.Module()
    module.vae = vae
    module.probe = nn.Linear(vae.config.latent_dim, lm.config.n_embd).to(device)
    k, pad = vae.config.latent_stride, tok.pad_id

    def align(ids, mean):
        b, L = ids.shape
        h = hidden_states(lm, ids, pad, layer).view(b, L // k, k, -1).mean(2)       # (B, N, H)
        text = (ids != pad).view(b, L // k, k).any(-1).float()                     # (B, N)
        cos = F.cosine_similarity(module.probe(mean.float()), h, dim=-1)           # (B, N)
        return ((1 - cos) * text).sum() / text.sum().clamp_min(1)

    return module, align


def train_vae(input_path, output: Path, tokenizer_path: Path, tc: VAETrainConfig, device,
              ckpt_path: Path, log_path=None, resume=False) -> dict:
    from tdiff.core.device import seed_everything
    from tdiff.text.tokenizer import Tokenizer

    tok = Tokenizer.load(tokenizer_path, option="-t/--tokenizer")
    data, train, held = D.read_split(input_path, tok.vocab_size, tc.holdout)
    max_len = tc.max_len or auto_max_len(train.seqs, tc.latent_stride)
    if max_len % tc.latent_stride:
        raise UsageError(f"--max-len {max_len} must be a multiple of --latent-stride {tc.latent_stride}")
    encoder_lm, lm_state = _frozen_encoder(tc, tok, device)
    seed_everything(tc.loop.seed)
    bos = tok.bos_id if 0 <= tok.bos_id < tok.vocab_size else tok.pad_id    # a tokenizer without [bos]: pad
    vae = build_vae(tc, tok.vocab_size, tok.pad_id, max_len, encoder_lm, bos_id=bos)
    if lm_state is not None:
        vae.load_encoder_lm(lm_state)
    vae = vae.to(device)
    trained = sum(p.numel() for p in vae.parameters() if p.requires_grad)
    frozen = f" + {vae.num_params() - trained:,} frozen (--encoder)" if encoder_lm else ""
    log.info(f"train-vae: {len(train.seqs):,} train / {len(held.seqs):,} held-out sequences, max_len {max_len}, "
             f"{trained / 1e6:.2f}M parameters{frozen}, device {device}")
    fingerprint = {"vae": vae.config.to_dict(), "data": data.digest, "train": asdict(tc) | {"loop": None}}
    order = D.BatchIndex(len(train.seqs), tc.batch_size, tc.loop.seed)
    module, align = _with_aligner(vae, tok, tc, device)

    def step_fn(step, micro):
        idx = order(micro)
        ids = D.pad_batch([train.seqs[i] for i in idx], max_len, tok.pad_id).to(device)  # (B, L)
        beta = tc.beta * min(1.0, step / max(1, tc.kl_warmup))
        out = vae(ids, beta=beta, free_bits=tc.free_bits)
        metrics = {"rec": out["rec"].item(), "kl": out["kl"].item(), "acc": out["acc"].item()}
        if "ctx_rec" in out:                           # the contextual decoder's, teacher-forced
            metrics.update(ctx_rec=out["ctx_rec"].item(), ctx_acc=out["ctx_acc"].item())
        if align is None:
            return out["loss"], metrics, ids.numel()
        a = align(ids, out["mean"])
        metrics["align_cos"] = 1 - a.item()
        return out["loss"] + tc.align_weight * a, metrics, ids.numel()

    watch = D.pad_batch(held.seqs[:256], max_len, tok.pad_id).to(device) if held.seqs else None   # (≤256, L)

    def evaluate():
        """--eval-every: reconstruction loss and token accuracy of the posterior means on (at most 256
        of) the held-out sequences (and the contextual decoder's, teacher-forced)."""
        if watch is None:
            return {}
        out = vae(watch, beta=0.0, sample=False)
        ctx = {"heldout_ctx_rec": out["ctx_rec"], "heldout_ctx_acc": out["ctx_acc"]} if "ctx_rec" in out else {}
        return {"heldout_rec": out["rec"], "heldout_acc": out["acc"], **ctx}

    trainer = Trainer(module, step_fn, tc.loop, device, ckpt_path=ckpt_path, log_path=log_path, fingerprint=fingerprint,
                      evaluate=evaluate)
    if resume:
        trainer.resume()
    summary = trainer.run()
    with trainer.finishing(f"writing {output}"):
        ema = trainer.ema_state_dict()
        vae.load_state_dict({k[4:]: v for k, v in ema.items() if k.startswith("vae.")} if align is not None else ema)
        mean, std = latent_stats(vae, train.seqs, max_len, tok.pad_id, device)
        vae.set_latent_stats(mean.to(device), std.to(device))
        metrics = reconstruction_metrics(vae, held.seqs or train.seqs[:256], max_len, tok.pad_id, device)
        summary["heldout"] = metrics
        if distributed.is_main():                     # rank 0 writes (torchrun)
            save_vae(output, vae.state_dict(), {"vae": vae.config.to_dict()},
                     {**summary, "seed": tc.loop.seed, "data": data.digest, "config": asdict(tc)}, tok)
        log.info(f"train-vae: held-out token accuracy {metrics['token_accuracy']:.4f}, exact match "
                 f"{metrics['exact_match']:.4f} on {metrics['sequences']} sequences; wrote {output}")
    return summary
