"""Train the DiT denoiser on VAE latents (SPEC §2 train) and write the self-contained `model` artifact.

Latents are the VAE posterior means, normalized by the stored latent mean/std
(unit variance), computed once into an in-memory cache. Each step draws
t ~ U(0, 1) (stratified across the batch), noises x0 to x_t = α_t x0 + σ_t ε,
and regresses the chosen target (x0, eps or v). Self-conditioning (Chen et al.
2022, "Analog Bits") feeds the previous x0 estimate half of the time. A share
of the batch gets a span of known clean latents through the conditioning
channel (prefix, infix or random spans) so one model also prompts and infills.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from tdiff import log
from tdiff.errors import DataError, UsageError
from tdiff.training import checkpoints as ck
from tdiff.training import data as D
from tdiff.training.loop import LoopConfig, Trainer


@dataclass
class DiTTrainConfig:
    preset: str = "tiny"
    schedule: str = "cosine"
    target: str = "v"                 # x0 | eps | v
    self_condition: bool = True
    cond_prob: float = 0.25           # share of examples trained with a known span
    batch_size: int = 64
    holdout: float = 0.02
    loop: LoopConfig = field(default_factory=LoopConfig)


def _denoiser_module(dit, schedule):
    """The DiT and the schedule as one nn.Module, so a learned schedule trains (and EMAs) with it."""
    import torch.nn as nn

    m = nn.Module()
    m.dit = dit
    m.schedule = schedule
    return m


def encode_latents(vae, seqs, max_len, pad_id, device, batch_size=256):
    """(N, Lz, Dz) normalized posterior means of SEQS, on DEVICE, float32."""
    import torch

    out = []
    vae.eval()
    with torch.no_grad():
        for i in range(0, len(seqs), batch_size):
            ids = D.pad_batch(seqs[i:i + batch_size], max_len, pad_id).to(device)
            mu, _ = vae.encode(ids)                                    # (B, Lz, Dz)
            out.append(vae.normalize(mu).float())
    return torch.cat(out)


def random_cond_mask(b, n, prob, generator, device):
    """(B, N, 1) float mask of known positions: for a PROB share of rows a prefix, suffix or inner span."""
    import torch

    mask = torch.zeros(b, n, 1, device=device)
    use = torch.rand(b, generator=generator, device=device) < prob
    for i in torch.nonzero(use).flatten().tolist():
        a, c = sorted(torch.randint(0, n + 1, (2,), generator=generator, device=device).tolist())
        kind = int(torch.randint(0, 3, (1,), generator=generator, device=device))
        if kind == 0:      # prefix known (prompting)
            mask[i, :c] = 1
        elif kind == 1:    # a span unknown (infilling)
            mask[i] = 1
            mask[i, a:c] = 0
        else:              # a span known
            mask[i, a:c] = 1
    return mask


def diffusion_loss(dit, schedule, x0, tc: DiTTrainConfig, generator, label=None):
    """Mean squared error of the target on unknown positions (+ schedule terms). Returns (loss, metrics)."""
    import torch

    from tdiff.diffusion.process import add_noise, pred_to_eps, pred_to_x0, target

    b, n, _ = x0.shape
    dev = x0.device
    u = torch.rand((), generator=generator, device=dev).item()
    t = ((torch.arange(b, device=dev, dtype=torch.float64) + u) / b).clamp(1e-5, 1 - 1e-5)   # (B,) stratified
    t = t[torch.randperm(b, generator=generator, device=dev)]
    with torch.no_grad():  # a learned schedule trains only through vdm_variance_loss, never the MSE
        alpha, sigma = schedule.alpha_sigma(t)                           # (B,) float64
    a32, s32 = alpha.float(), sigma.float()
    eps = torch.randn(x0.shape, generator=generator, device=dev)
    x_t = add_noise(x0, eps, a32, s32)                                   # (B, N, D)
    cond_mask = random_cond_mask(b, n, tc.cond_prob, generator, dev) if tc.cond_prob > 0 else None
    cond_x = x0 * cond_mask if cond_mask is not None else None
    if cond_mask is not None:
        x_t = cond_mask * x0 + (1 - cond_mask) * x_t
    tt = t.float()
    self_cond = None
    if tc.self_condition and torch.rand((), generator=generator, device=dev).item() < 0.5:
        with torch.no_grad():
            p0 = dit(x_t.detach(), tt, self_cond=None, label=label, cond_x=cond_x, cond_mask=cond_mask)
            self_cond = pred_to_x0(tc.target, p0.float(), x_t.detach(), a32, s32).detach()
    pred = dit(x_t, tt, self_cond=self_cond, label=label, cond_x=cond_x, cond_mask=cond_mask).float()
    tgt = target(tc.target, x0, eps, a32, s32)
    err = (pred - tgt) ** 2                                               # (B, N, D)
    w = (1 - cond_mask) if cond_mask is not None else torch.ones_like(err[..., :1])
    per_ex = (err * w).sum((1, 2)) / (w.sum((1, 2)) * err.shape[-1]).clamp_min(1)   # (B,)
    loss = per_ex.mean()
    metrics = {"mse": loss.item()}
    reg = schedule.regularizer()
    if any(p.requires_grad for p in schedule.parameters()):
        from tdiff.diffusion.schedules import vdm_variance_loss

        eps_mse = ((pred_to_eps(tc.target, pred.detach(), x_t.detach(), a32, s32) - eps) ** 2)
        sched_loss = vdm_variance_loss(schedule, t, (eps_mse * w).sum((1, 2)))
        loss = loss + sched_loss + reg
        metrics["sched"] = float(sched_loss)
    return loss, metrics


def train_dit(input_path, output: Path, vae_path: Path, tc: DiTTrainConfig, device, ckpt_path: Path,
              log_path=None, resume=False) -> dict:
    import torch

    from tdiff.bundle import load_vae
    from tdiff.device import seed_everything
    from tdiff.diffusion.schedules import make_schedule
    from tdiff.models.dit import PRESETS, DiT, DiTConfig

    if tc.target not in ("x0", "eps", "v"):
        raise UsageError(f"--target {tc.target!r}: choose x0, eps or v")
    if tc.preset not in PRESETS:
        raise UsageError(f"--preset {tc.preset!r}: choose one of {', '.join(PRESETS)}")
    vae, tok, vae_art = load_vae(vae_path, device)
    data = D.read_ids(input_path, vocab_size=tok.vocab_size)
    if not data.seqs:
        raise DataError(f"{input_path}: no token records to train on")
    train, held = D.split(data, tc.holdout)
    vcfg = vae.config
    seed_everything(tc.loop.seed)
    lat = encode_latents(vae, train.seqs, vcfg.max_len, tok.pad_id, device)          # (N, Lz, Dz)
    n_lat, dz = lat.shape[1], lat.shape[2]
    try:
        schedule = make_schedule(tc.schedule)
    except ValueError as e:
        raise UsageError(f"--schedule: {e}") from None
    dit = DiT(DiTConfig(**{**PRESETS[tc.preset], "latent_dim": dz, "max_len": n_lat,
                           "self_condition": tc.self_condition}))
    module = _denoiser_module(dit, schedule).to(device)
    log.info(f"train: {len(train.seqs):,} sequences → latents {tuple(lat.shape[1:])}, "
             f"DiT {dit.num_params() / 1e6:.2f}M parameters, schedule {tc.schedule}, target {tc.target}, device {device}")
    fingerprint = {"dit": dit.config.to_dict(), "data": data.digest, "vae": vae_art.train.get("data"),
                   "train": asdict(tc) | {"loop": None}}
    gen = torch.Generator(device=device).manual_seed(tc.loop.seed)
    batches = D.batches(len(train.seqs), tc.batch_size, tc.loop.seed)

    def step_fn(step):
        idx = next(batches).to(device)
        x0 = lat[idx]                                                   # (B, Lz, Dz)
        loss, m = diffusion_loss(module.dit, module.schedule, x0, tc, gen)
        return loss, m, x0.shape[0] * vcfg.max_len

    trainer = Trainer(module, step_fn, tc.loop, device, ckpt_path=ckpt_path, log_path=log_path, fingerprint=fingerprint)
    if resume and trainer.resume():
        batches = D.batches(len(train.seqs), tc.batch_size, tc.loop.seed, start_step=trainer.step * tc.loop.grad_accum)
        gen.manual_seed(tc.loop.seed + 7919 * trainer.step)
    summary = trainer.run()
    if summary["interrupted"]:
        log.info(f"interrupted: checkpoint at {ckpt_path}; rerun with --resume to continue")
        return summary
    # held-out denoising loss with the EMA weights, fixed seed
    ema = trainer.ema_state_dict()
    eval_mod = _denoiser_module(DiT(dit.config), make_schedule(**schedule.config())).to(device)
    eval_mod.load_state_dict(ema)
    if held.seqs:
        hl = encode_latents(vae, held.seqs, vcfg.max_len, tok.pad_id, device)
        g2 = torch.Generator(device=device).manual_seed(1234)
        tc_eval = DiTTrainConfig(**{**asdict(tc), "loop": tc.loop, "cond_prob": 0.0, "self_condition": False})
        with torch.no_grad():
            losses = [diffusion_loss(eval_mod.dit, eval_mod.schedule, hl[i:i + 256], tc_eval, g2)[1]["mse"]
                      for i in range(0, len(hl), 256)]
        summary["heldout_loss"] = round(sum(losses) / len(losses), 6)
    tensors = {f"vae.{k}": v for k, v in vae.state_dict().items()}
    tensors.update({f"dit.{k}": v for k, v in module.dit.state_dict().items()})
    tensors.update({f"dit_ema.{k[4:]}": v for k, v in ema.items() if k.startswith("dit.")})
    tensors.update({f"schedule.{k[9:]}": v for k, v in ema.items() if k.startswith("schedule.")})
    config = {"vae": vcfg.to_dict(), "dit": dit.config.to_dict(), "schedule": schedule.config(),
              "diffusion": {"target": tc.target, "self_condition": tc.self_condition}}
    ck.save_artifact(output, tensors, "model", config=config,
                     train={**summary, "seed": tc.loop.seed, "data": data.digest, "config": asdict(tc),
                            "vae_train": vae_art.train},
                     tokenizer=tok.to_bytes(), tokenizer_meta=tok.meta)
    log.info(f"train: wrote {output}")
    return summary
