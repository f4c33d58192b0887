"""Train the DiT denoiser on VAE latents and write the self-contained `model` artifact.

Latents are the VAE posterior means, normalized by the stored latent mean/std
(unit variance), computed once into an in-memory cache (tdiff/data/latents.py). Each
step is the denoising loss of tdiff/diffusion/losses.py (stratified t, the chosen
target, self-conditioning, known spans). `--t-sampling adaptive` draws t from the time
warp of tdiff/diffusion/timewarp.py (stored in the artifact); `--decoder-ce W` adds W times
the frozen VAE decoder's token cross-entropy on the x0 estimate (gradients flow through the
decoder into the denoiser; the decoder is not trained). With `--schedule learned` the objective
adds the schedule's own terms (VDM variance loss and smoothness penalty); they
train only the schedule, are logged apart from the denoiser's MSE, and the
schedule's gradient is clipped apart from the denoiser's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from tdiff.core import log
from tdiff.data import token_ids as D
from tdiff.core.choices import T_SAMPLINGS
from tdiff.core.errors import UsageError
from tdiff.data.latents import encode_latents
from tdiff.training.latent_data import draw_conditions, load_latents
from tdiff.formats.model import save_model
from tdiff.training import distributed
from tdiff.training.loop import LoopConfig, Trainer


@dataclass
class DiTTrainConfig:
    preset: str = "tiny"
    schedule: str = "cosine"
    target: str = "v"                 # x0 | eps | v
    self_condition: bool = True
    cond_prob: float = 0.25           # share of examples trained with known spans (diffusion/spans.py)
    label_field: str = ""             # JSONL field of a class label ("": unconditional)
    label_dropout: float = 0.1        # share of labelled rows shown the null label (classifier-free guidance)
    t_sampling: str = "adaptive"      # adaptive | uniform (CDCD time warping, diffusion/timewarp.py)
    decoder_ce: float = 0.0           # weight of the frozen decoder's token CE on the x0 estimate
    d_model: int = 0                  # 0: the preset's width
    n_layers: int = 0                 # 0: the preset's depth
    block_size: int = 0               # latent positions per block of block-causal diffusion (0: the window, parallel)
    batch_size: int = 64
    holdout: float = 0.02
    loop: LoopConfig = field(default_factory=LoopConfig)


def _denoiser_module(dit, schedule, warp=None):
    """The DiT and the schedule as one nn.Module, so a learned schedule trains (and EMAs) with it;
    the time warp's buffers ride along so a checkpoint resumes them exactly."""
    import torch.nn as nn

    m = nn.Module()
    m.dit = dit
    m.schedule = schedule
    if warp is not None:
        m.warp = warp
    return m


EVAL_SEQS = 256          # held-out sequences of the periodic figure (--eval-every); the final one takes all


def train_dit(input_path, output: Path, vae_path: Path, tc: DiTTrainConfig, device, ckpt_path: Path,
              log_path=None, resume=False) -> dict:
    import torch

    from tdiff.formats.model import load_vae
    from tdiff.core.device import seed_everything
    from tdiff.diffusion.losses import decoder_cross_entropy, diffusion_loss, mean_denoising_loss
    from tdiff.diffusion.schedules import make_schedule, vdm_variance_loss
    from tdiff.diffusion.timewarp import TimeWarp
    from tdiff.models.dit import PRESETS, DiT, DiTConfig
    from tdiff.core.seeds import generator

    if tc.target not in ("x0", "eps", "v"):
        raise UsageError(f"--target {tc.target!r}: choose x0, eps or v")
    if tc.t_sampling not in T_SAMPLINGS:
        raise UsageError(f"--t-sampling {tc.t_sampling!r}: choose one of {', '.join(T_SAMPLINGS)}")
    if tc.preset not in PRESETS:
        raise UsageError(f"--preset {tc.preset!r}: choose one of {', '.join(PRESETS)}")
    vae, tok, vae_art = load_vae(vae_path, device)
    seed_everything(tc.loop.seed)
    need_ids = tc.decoder_ce > 0 or tc.cond_prob > 0
    if need_ids:
        vae.requires_grad_(False)
    ld = load_latents(input_path, vae, tok, holdout=tc.holdout, label_field=tc.label_field, device=device,
                      need_ids=need_ids)
    data, train, held, lat, label_names = ld.data, ld.train, ld.held, ld.lat, ld.label_names   # lat (M, N, D)
    vcfg = vae.config
    n_lat, dz = lat.shape[1], lat.shape[2]
    try:
        schedule = make_schedule(tc.schedule)
    except ValueError as e:
        raise UsageError(f"--schedule: {e}") from None
    size = {k: v for k, v in (("d_model", tc.d_model), ("n_layers", tc.n_layers)) if v}
    try:
        dit = DiT(DiTConfig(**{**PRESETS[tc.preset], **size, "latent_dim": dz, "max_len": n_lat,
                               "self_condition": tc.self_condition, "num_labels": len(label_names),
                               "block_size": tc.block_size if tc.block_size < n_lat else 0}))
    except ValueError as e:
        raise UsageError(f"--d-model/--n-layers: {e}") from None
    blocks = -(-n_lat // dit.config.block)               # K noise levels per sequence
    if blocks > 1 and tc.schedule == "learned":
        raise UsageError("--schedule learned: not available with --block-size (one time per block)")
    warp = TimeWarp() if tc.t_sampling == "adaptive" else None
    module = _denoiser_module(dit, schedule, warp).to(device)
    log.info(f"train: {len(train.seqs):,} sequences → latents {tuple(lat.shape[1:])}, "
             f"DiT {dit.num_params() / 1e6:.2f}M parameters, schedule {tc.schedule}, target {tc.target}, "
             f"t-sampling {tc.t_sampling}, decoder CE {tc.decoder_ce}, known spans {tc.cond_prob}, "
             + (f"block-causal, {blocks} blocks of {dit.config.block}, " if blocks > 1 else "")
             + (f"labels {', '.join(label_names)} (dropout {tc.label_dropout}), " if label_names else "")
             + f"device {device}")
    fingerprint = {"dit": dit.config.to_dict(), "data": data.digest, "vae": vae_art.train.get("data"),
                   "train": asdict(tc) | {"loop": None}}
    gen = generator(tc.loop.seed, 0, "noise", device)                 # t, ε, spans: checkpointed
    order = D.BatchIndex(len(train.seqs), tc.batch_size, tc.loop.seed)
    pending = []                       # (t, progress) of this process's micro-batches, for the time warp

    learn_schedule = any(p.requires_grad for p in schedule.parameters())

    def step_fn(step, micro):
        idx = order(micro).to(device)
        x0 = lat[idx]                                                   # (B, Lz, Dz)
        t = warp.sample(len(idx) * blocks, gen, device) if warp is not None else None   # (B·K,)
        cond_x, cond_mask, label = draw_conditions(ld, idx, vae, tok, cond_prob=tc.cond_prob,
                                                   label_dropout=tc.label_dropout, generator=gen)
        terms = diffusion_loss(module.dit, module.schedule, x0, target=tc.target, generator=gen, t=t,
                               self_condition=tc.self_condition, cond_x=cond_x, cond_mask=cond_mask, label=label,
                               eps_error=learn_schedule, estimates=True, x0_grad=tc.decoder_ce > 0)
        mse = terms.mse.mean()
        objective, metrics = mse, {"mse": mse.item(), "x0_error": terms.x0_error.mean().item()}
        progress = terms.x0_error if blocks == 1 else terms.x0_error_blocks   # (B,) or (B, K): what the warp follows
        if tc.decoder_ce > 0:
            ce_rows = decoder_cross_entropy(lambda z: vae.decode(vae.denormalize(z)), terms.x0_hat, ld.ids[idx],
                                            terms.unknown, tok.pad_id)     # (B,) frozen decoder, graph to the DiT
            ce = ce_rows.mean()
            objective = objective + tc.decoder_ce * ce
            metrics.update(loss=metrics["mse"], decoder_ce=ce.item())
            progress = ce_rows.detach()
        if warp is not None:
            pending.append(torch.stack([terms.t.detach().double().reshape(-1),
                                        progress.detach().double().reshape(-1)]))   # (2, B·K)
        if not learn_schedule:
            return objective, metrics, x0.shape[0] * vcfg.max_len
        var = vdm_variance_loss(module.schedule, terms.t, terms.eps_error)
        reg = module.schedule.regularizer()
        metrics.update(loss=metrics["mse"], sched_var=var.detach().item(), sched_reg=reg.detach().item())
        return objective + var + reg, metrics, x0.shape[0] * vcfg.max_len

    clip_groups = {"grad_norm": module.dit.parameters()}
    if learn_schedule:
        clip_groups["grad_norm_schedule"] = module.schedule.parameters()
    def update_warp(trainer):
        """The time warp learns from every micro-batch of the step, all ranks', in the run's order
        (after the update, so W processes and one process see the same warp at every step)."""
        if warp is None or not pending:
            return
        from tdiff.training.distributed import all_gather

        local = torch.stack(pending)                                    # (share, 2, B)
        pending.clear()
        for t_k, p_k in all_gather(local):                              # (grad_accum, 2, B) in micro order
            warp.update(t_k, p_k)

    watch = []                         # held-out latents of --eval-every, encoded at its first use

    def evaluate():
        """--eval-every: the held-out denoising loss on (at most EVAL_SEQS of) the held-out split,
        fixed draws."""
        if not held.seqs:
            return {}
        if not watch:
            watch.append(encode_latents(vae, held.seqs[:EVAL_SEQS], vcfg.max_len, tok.pad_id, device))
        g = generator(tc.loop.seed, 1, "eval", device)
        return {"heldout_loss": mean_denoising_loss(module.dit, module.schedule, watch[0], target=tc.target,
                                                    generator=g)}

    trainer = Trainer(module, step_fn, tc.loop, device, ckpt_path=ckpt_path, log_path=log_path,
                      fingerprint=fingerprint, clip_groups=clip_groups, generators={"noise": gen},
                      after_step=update_warp, evaluate=evaluate)
    if resume:
        trainer.resume()
    summary = trainer.run()
    with trainer.finishing(f"writing {output}"):
        # held-out denoising loss with the EMA weights
        ema = trainer.ema_state_dict()
        eval_mod = _denoiser_module(DiT(dit.config), make_schedule(**schedule.config()),
                                    TimeWarp(**warp.config()) if warp is not None else None).to(device)
        eval_mod.load_state_dict(ema)
        if held.seqs:
            hl = encode_latents(vae, held.seqs, vcfg.max_len, tok.pad_id, device)
            g2 = generator(tc.loop.seed, 0, "eval", device)
            with torch.no_grad():
                loss = mean_denoising_loss(eval_mod.dit, eval_mod.schedule, hl, target=tc.target, generator=g2)
            summary["heldout_loss"] = round(loss, 6)
        parts = {"vae": vae.state_dict(), "dit": module.dit.state_dict(),
                 "dit_ema": {k[4:]: v for k, v in ema.items() if k.startswith("dit.")},
                 "schedule": {k[9:]: v for k, v in ema.items() if k.startswith("schedule.")}}
        config = {"vae": vcfg.to_dict(), "dit": dit.config.to_dict(), "schedule": schedule.config(),
                  "diffusion": {"target": tc.target, "self_condition": tc.self_condition,
                                "known_spans": tc.cond_prob > 0, "cond_prob": tc.cond_prob}}
        if label_names:
            config["labels"] = {"field": tc.label_field, "names": label_names}
        if warp is not None:                     # the measured error curve (raw, not EMA-averaged)
            parts["timewarp"] = warp.state_dict()
            config["timewarp"] = warp.config()
        if distributed.is_main():                     # rank 0 writes (torchrun)
            save_model(output, "model", parts, config,
                       {**summary, "seed": tc.loop.seed, "data": data.digest, "config": asdict(tc),
                        "vae_train": vae_art.train}, tok)
        log.info(f"train: wrote {output}")
    return summary
