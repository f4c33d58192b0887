"""Figures of a model on held-out ids, each a plain dict:

- ``reconstruction``  VAE token accuracy and exact-match rate (posterior mean decoded greedily;
  accuracy counts the text positions and the pad that ends the text).
- ``noise_levels``    per noise level t: token accuracy of decoding the noisy latent directly and of
  decoding the denoiser's x0 estimate, and the denoiser's loss (where the denoiser adds information).
- ``denoising``       held-out denoising loss of a diffusion model: the MSE of its training target
  (x0, eps or v) on fresh noise, with no conditioning span and no self-conditioning, averaged over
  ``t_samples`` passes, each drawing stratified t across a batch (a fixed seed: the same number every run).
- ``perplexity``      held-out perplexity of a ``train-ar`` model, exp(Σ NLL / tokens), scoring the ids
  and the eos after [bos].

torch is imported inside the functions: the command line imports NOISE_LEVELS from here for --help.
"""

from __future__ import annotations

import math

from tdiff.core.errors import DataError, UsageError

SCORE_BATCH = 64          # sequences per forward pass when scoring (not timed)


def reconstruction(vae, tok, seqs, device, dtype: str = "fp32") -> dict:
    """{"token_accuracy", "exact_match", "sequences", "truncated"} of the VAE on SEQS."""
    from tdiff.core.device import autocast
    from tdiff.data.latents import reconstruction_metrics

    max_len = vae.config.max_len
    with autocast(device, dtype):
        out = reconstruction_metrics(vae, seqs, max_len, tok.pad_id, device, batch_size=SCORE_BATCH)
    out["truncated"] = sum(len(s) > max_len for s in seqs)     # longer than the VAE's max_len: cut
    out["max_len"] = max_len
    return out


def denoising(bundle, seqs, device, seed: int = 0, t_samples: int = 4, dtype: str = "fp32") -> dict:
    """Held-out denoising loss: the mean over T_SAMPLES passes over SEQS of the per-example loss of
    tdiff.diffusion.losses (no conditioning span, no self-conditioning, stratified t, fresh noise)."""
    import torch

    from tdiff.core.device import autocast
    from tdiff.diffusion.losses import mean_denoising_loss
    from tdiff.data.latents import encode_latents
    from tdiff.core.seeds import generator

    if t_samples < 1:
        raise UsageError("--t-samples must be at least 1")
    vae, tok = bundle.vae, bundle.tokenizer
    lat = encode_latents(vae, seqs, vae.config.max_len, tok.pad_id, device, batch_size=SCORE_BATCH)  # (N, Lz, Dz)
    target = bundle.diffusion.get("target", "v")
    g = generator(seed, 0, "eval", device)
    with torch.no_grad(), autocast(device, dtype):
        per_pass = [mean_denoising_loss(bundle.dit, bundle.schedule, lat, target=target, generator=g,
                                        batch_size=SCORE_BATCH) for _ in range(t_samples)]
    return {"loss": sum(per_pass) / len(per_pass), "target": target, "t_samples": t_samples, "sequences": len(seqs),
            "loss_std_over_passes": _std(per_pass)}


NOISE_LEVELS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)


def check_noise_levels(levels) -> tuple:
    """LEVELS as a tuple of floats, each strictly between 0 and 1; a UsageError naming --noise-levels otherwise."""
    levels = tuple(float(t) for t in levels)
    bad = [t for t in levels if not 0 < t < 1]
    if not levels or bad:
        raise UsageError(f"--noise-levels: each level must be strictly between 0 and 1 (got {bad or 'none'})")
    return levels


def noise_levels(bundle, seqs, device, levels=NOISE_LEVELS, seed: int = 0, dtype: str = "fp32") -> dict:
    """Where the denoiser adds information: for each noise level t, the held-out latents are noised to
    x_t = α_t x0 + σ_t ε and decoded greedily through the VAE (`TextVAE.decode_ids`: token by token for a
    contextual decoder) two ways,

      naive     x_t / α_t, no network (what the noisy input alone already says),
      denoiser  the network's x0 estimate (one pass, no self-conditioning, no known span),

    with the token accuracy of each on the text positions (pads excluded), their difference
    ("gain"), and the denoiser's loss at that t (the training target's MSE). Same noise for both.
    Returns {"by_t": {"0.5": {...}, ...}, "tokens", "sequences"}.
    """
    import torch

    from tdiff.data.token_ids import pad_batch
    from tdiff.core.device import autocast
    from tdiff.diffusion.losses import diffusion_loss
    from tdiff.data.latents import encode_latents
    from tdiff.core.seeds import generator

    levels = check_noise_levels(levels)
    vae, tok = bundle.vae, bundle.tokenizer
    max_len = vae.config.max_len
    lat = encode_latents(vae, seqs, max_len, tok.pad_id, device, batch_size=SCORE_BATCH)   # (M, N, D)
    ids = pad_batch(seqs, max_len, tok.pad_id)                                              # (M, L)
    text = ids != tok.pad_id                                                                # (M, L)
    n_tok = int(text.sum())
    target = bundle.diffusion.get("target", "v")
    g = generator(seed, 0, "eval", device)
    by_t = {}
    with torch.no_grad(), autocast(device, dtype):
        for lvl in levels:
            correct = {"naive": 0, "denoiser": 0}
            loss_sum = 0.0
            for i in range(0, len(lat), SCORE_BATCH):
                x0 = lat[i:i + SCORE_BATCH]                                                 # (B, N, D)
                t = torch.full((len(x0),), float(lvl), dtype=torch.float64, device=device)  # (B,)
                terms = diffusion_loss(bundle.dit, bundle.schedule, x0, target=target, generator=g, t=t,
                                       estimates=True)
                a = terms.alpha.to(x0.dtype).reshape(len(x0), -1)[:, :1, None]             # (B, 1, 1); blocks alike
                want = ids[i:i + SCORE_BATCH].to(device)                                    # (B, L)
                keep = text[i:i + SCORE_BATCH].to(device)                                   # (B, L)
                for which, z in (("naive", terms.x_t.float() / a), ("denoiser", terms.x0_hat.float())):
                    pred = vae.decode_ids(vae.denormalize(z))                               # (B, L) greedy
                    correct[which] += int(((pred == want) & keep).sum())
                loss_sum += float(terms.mse.sum())
            acc = {k: v / max(1, n_tok) for k, v in correct.items()}
            lam = float(bundle.schedule.log_snr(torch.tensor([lvl], dtype=torch.float64, device=device)))
            by_t[f"{lvl:g}"] = {"log_snr": lam, "naive_accuracy": acc["naive"], "denoiser_accuracy": acc["denoiser"],
                                "gain": acc["denoiser"] - acc["naive"], "loss": loss_sum / len(lat)}
    return {"by_t": by_t, "tokens": n_tok, "sequences": len(seqs), "target": target}


def _std(xs) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def ar_perplexity(model, seqs, device, dtype: str = "fp32") -> dict:
    """{"perplexity", "nll_per_token", "tokens", "sequences"} of a train-ar model on SEQS."""
    from tdiff.evaluation.perplexity import heldout_perplexity

    if max(max(s) for s in seqs) >= model.config.vocab_size:
        raise DataError(f"token ids outside the AR model's vocabulary ({model.config.vocab_size})")
    p, nll, n = heldout_perplexity(model, seqs, device=device, batch_size=SCORE_BATCH, dtype=dtype)
    return {"perplexity": p, "nll_per_token": nll / n if n else float("nan"), "tokens": n, "sequences": len(seqs)}
