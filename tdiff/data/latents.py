"""Between token ids and the VAE's latent space, for a whole corpus at a time.

`encode_latents` (the denoiser's training data and held-out latents), `latent_stats`
(the per-dimension mean and std stored in the VAE so the denoiser sees unit variance)
and `reconstruction_metrics` (how well the VAE decodes its own posterior means) are
called by training, evaluation and the benchmarks alike: one definition each.
"""

from __future__ import annotations

from tdiff.data.token_ids import pad_batch


def encode_latents(vae, seqs, max_len, pad_id, device, batch_size=256):
    """(M, Lz, Dz) normalized posterior means of SEQS, on DEVICE, float32."""
    import torch

    out = []
    vae.eval()
    with torch.no_grad():
        for i in range(0, len(seqs), batch_size):
            ids = pad_batch(seqs[i:i + batch_size], max_len, pad_id).to(device)    # (B, L)
            mu, _ = vae.encode(ids)                                                # (B, Lz, Dz)
            out.append(vae.normalize(mu).float())
    return torch.cat(out)


def latent_stats(vae, seqs, max_len, pad_id, device, batch_size=256):
    """Per-dimension mean and std of the encoder means over SEQS (so the denoiser sees unit variance)."""
    import torch

    s1 = s2 = None
    n = 0
    vae.eval()
    with torch.no_grad():
        for i in range(0, len(seqs), batch_size):
            ids = pad_batch(seqs[i:i + batch_size], max_len, pad_id).to(device)    # (B, L)
            mu, _ = vae.encode(ids)                                                # (B, N, Dz)
            mu = mu.double().reshape(-1, mu.shape[-1])                             # (B·N, Dz)
            s1 = mu.sum(0) if s1 is None else s1 + mu.sum(0)
            s2 = (mu * mu).sum(0) if s2 is None else s2 + (mu * mu).sum(0)
            n += mu.shape[0]
    mean = s1 / n
    std = (s2 / n - mean * mean).clamp_min(1e-12).sqrt()
    return mean.float(), std.float()


def reconstruction_metrics(vae, seqs, max_len, pad_id, device, batch_size=256) -> dict:
    """Token accuracy (text positions and the end-of-text pad) and exact-match rate, decoding the posterior
    mean greedily (`TextVAE.decode_ids`: a contextual decoder free-running, not teacher-forced)."""
    import torch

    correct = total = exact = 0
    vae.eval()
    with torch.no_grad():
        for i in range(0, len(seqs), batch_size):
            chunk = seqs[i:i + batch_size]
            ids = pad_batch(chunk, max_len, pad_id).to(device)          # (B, L)
            mu, _ = vae.encode(ids)                                    # (B, Lz, Dz)
            pred = vae.decode_ids(mu)                                  # (B, L) greedy, token by token if contextual
            for b, s in enumerate(chunk):
                n = min(len(s), max_len)
                upto = min(n + 1, max_len)                             # text + the pad that ends it
                eq = pred[b, :upto] == ids[b, :upto]
                correct += int(eq.sum())
                total += upto
                exact += int(bool((pred[b] == ids[b]).all()))
    return {"token_accuracy": correct / max(1, total), "exact_match": exact / max(1, len(seqs)),
            "sequences": len(seqs)}
