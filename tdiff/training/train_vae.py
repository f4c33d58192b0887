"""Train the text VAE and write a self-contained `vae` artifact (tokenizer and latent statistics inside)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from tdiff import artifacts, log
from tdiff import data as D
from tdiff.errors import UsageError
from tdiff.latents import latent_stats, reconstruction_metrics
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
    batch_size: int = 64
    holdout: float = 0.02
    loop: LoopConfig = field(default_factory=LoopConfig)


def auto_max_len(seqs, stride: int, cap: int = 512) -> int:
    """99th-percentile length + 1 (room for the pad that marks the end), rounded up to a multiple of 8·stride."""
    q = D.length_percentile(seqs, 0.99) + 1
    m = 8 * stride
    return min(cap, max(m, -(-q // m) * m))


def build_vae(tc: VAETrainConfig, vocab_size: int, pad_id: int, max_len: int):
    from tdiff.models.vae import PRESETS, TextVAE, VAEConfig

    if tc.preset not in PRESETS:
        raise UsageError(f"--preset {tc.preset!r}: choose one of {', '.join(PRESETS)}")
    if tc.latent_stride not in (1, 2, 4):
        raise UsageError("--latent-stride must be 1, 2 or 4")
    cfg = VAEConfig(**{**PRESETS[tc.preset], "vocab_size": vocab_size, "max_len": max_len,
                       "latent_dim": tc.latent_dim, "latent_stride": tc.latent_stride, "pad_id": pad_id})
    return TextVAE(cfg)


def train_vae(input_path, output: Path, tokenizer_path: Path, tc: VAETrainConfig, device,
              ckpt_path: Path, log_path=None, resume=False) -> dict:
    from tdiff.device import seed_everything
    from tdiff.text.tokenizer import Tokenizer

    tok = Tokenizer.load(tokenizer_path)
    data, train, held = D.read_split(input_path, tok.vocab_size, tc.holdout)
    max_len = tc.max_len or auto_max_len(train.seqs, tc.latent_stride)
    if max_len % tc.latent_stride:
        raise UsageError(f"--max-len {max_len} must be a multiple of --latent-stride {tc.latent_stride}")
    seed_everything(tc.loop.seed)
    vae = build_vae(tc, tok.vocab_size, tok.pad_id, max_len).to(device)
    log.info(f"train-vae: {len(train.seqs):,} train / {len(held.seqs):,} held-out sequences, max_len {max_len}, "
             f"{sum(p.numel() for p in vae.parameters()) / 1e6:.2f}M parameters, device {device}")
    fingerprint = {"vae": vae.config.to_dict(), "data": data.digest, "train": asdict(tc) | {"loop": None}}
    batches = D.batches(len(train.seqs), tc.batch_size, tc.loop.seed)

    def step_fn(step):
        idx = next(batches)
        ids = D.pad_batch([train.seqs[i] for i in idx], max_len, tok.pad_id).to(device)  # (B, L)
        beta = tc.beta * min(1.0, step / max(1, tc.kl_warmup))
        out = vae(ids, beta=beta, free_bits=tc.free_bits)
        return out["loss"], {"rec": out["rec"].item(), "kl": out["kl"].item(), "acc": out["acc"].item()}, ids.numel()

    trainer = Trainer(vae, step_fn, tc.loop, device, ckpt_path=ckpt_path, log_path=log_path, fingerprint=fingerprint)
    if resume:
        trainer.resume()
        batches = D.batches(len(train.seqs), tc.batch_size, tc.loop.seed, start_step=trainer.step * tc.loop.grad_accum)
    summary = trainer.run()
    if summary["interrupted"]:
        log.info(f"interrupted: checkpoint at {ckpt_path}; rerun with --resume to continue")
        return summary
    vae.load_state_dict(trainer.ema_state_dict())
    mean, std = latent_stats(vae, train.seqs, max_len, tok.pad_id, device)
    vae.set_latent_stats(mean.to(device), std.to(device))
    metrics = reconstruction_metrics(vae, held.seqs or train.seqs[:256], max_len, tok.pad_id, device)
    summary["heldout"] = metrics
    tensors = {f"vae.{k}": v for k, v in vae.state_dict().items()}
    artifacts.save_artifact(output, tensors, "vae", config={"vae": vae.config.to_dict()},
                     train={**summary, "seed": tc.loop.seed, "data": data.digest, "config": asdict(tc)},
                     tokenizer=tok.to_bytes(), tokenizer_meta=tok.meta)
    log.info(f"train-vae: held-out token accuracy {metrics['token_accuracy']:.4f}, exact match "
             f"{metrics['exact_match']:.4f} on {metrics['sequences']} sequences; wrote {output}")
    return summary
