"""Known spans: the one definition that training and sampling share.

A *known span* is a stretch of token positions whose tokens are given (a prompt, the text around
a hole, the pads that fix a length). Prompting, infilling, editing and exact lengths are all the
same operation: generate the unknown positions given the known ones.

    ids (B, L), known (B, L) bool
      ─ unknown tokens replaced by unk ─▶ VAE encoder ─▶ normalized means  cond_x    (B, N, D)
      ─ a latent position is known when all its k = latent_stride tokens are ─▶ cond_mask (B, N, 1)

The encoder is bidirectional, so the latents of the *whole* text carry information about every
token; the known latents are therefore encoded from the text with its unknown tokens hidden (unk),
exactly as a user's template is encoded when sampling — the network never sees latents it could
not be given. Both sides then use :func:`merge`: the noisy input holds the clean known latents
(training: before the network, as in the loss; sampling: before every network call), and the x0
estimate is replaced by them at known positions. Decoded known tokens are finally replaced by the
given tokens (:func:`force_known`), so known text is reproduced exactly even where a latent
position mixes known and unknown tokens (latent_stride > 1).

Training draws `random_known` for a share of the rows (`tdiff train --cond-prob`): a known
prefix (prompting; half of them with the length fixed too), known text around an unknown span
(infilling), a known inner span, or known pads only (an exact length).
"""

from __future__ import annotations

import torch

from tdiff.data.token_ids import text_lengths

KINDS = ("prefix", "infill", "span", "length")


def random_known(ids: torch.Tensor, pad_id: int, prob: float, generator) -> torch.Tensor:
    """(B, L) bool known-token mask for training: a PROB share of the rows of IDS (B, L) get one
    of KINDS with equal chance, span ends drawn uniformly inside the text; other rows nothing."""
    b, L = ids.shape
    dev = ids.device
    known = torch.zeros(b, L, dtype=torch.bool, device=dev)
    use = torch.rand(b, generator=generator, device=dev) < prob                # (B,)
    rows = torch.nonzero(use).flatten().tolist()
    if not rows:
        return known
    lengths = text_lengths(ids, pad_id).tolist()
    for i in rows:
        n = lengths[i]
        a, c = sorted(torch.randint(0, n + 1, (2,), generator=generator, device=dev).tolist())
        kind = int(torch.randint(0, len(KINDS), (1,), generator=generator, device=dev))
        fix_len = bool(torch.randint(0, 2, (1,), generator=generator, device=dev))
        if kind == 0:                       # prompt: a known prefix, sometimes with the length fixed
            known[i, :c] = True
            if fix_len:
                known[i, n:] = True
        elif kind == 1:                     # infill: everything but one span
            known[i] = True
            known[i, a:c] = False
        elif kind == 2:                     # one known span inside the text
            known[i, a:c] = True
        else:                               # length: the pads only
            known[i, n:] = True
    return known


def latent_mask(known: torch.Tensor, stride: int) -> torch.Tensor:
    """(B, N, 1) float: a latent position is known when all STRIDE tokens it pools are (B, L) known."""
    b, L = known.shape
    return known.reshape(b, L // stride, stride).all(-1, keepdim=True).float()   # (B, N, 1)


def known_latents(vae, ids: torch.Tensor, known: torch.Tensor, unk_id: int) -> torch.Tensor:
    """(B, N, D) normalized posterior means of IDS (B, L) with the unknown tokens replaced by UNK_ID."""
    hidden = torch.where(known, ids, torch.full_like(ids, unk_id))            # (B, L)
    with torch.no_grad():
        mu, _ = vae.encode(hidden)                                          # (B, N, D) raw
        return vae.normalize(mu).float()


def condition(vae, ids: torch.Tensor, known: torch.Tensor, unk_id: int):
    """(cond_x (B, N, D), cond_mask (B, N, 1)) for the DiT from token-level KNOWN (B, L); (None, None)
    when no position of any row is known. Only the rows with a known token go through the encoder."""
    rows = known.any(-1)                                                    # (B,)
    if not bool(rows.any()):
        return None, None
    mask = latent_mask(known, vae.config.latent_stride)                      # (B, N, 1)
    if bool(rows.all()):
        return known_latents(vae, ids, known, unk_id) * mask, mask
    b, n = mask.shape[:2]
    part = known_latents(vae, ids[rows], known[rows], unk_id)                # (R, N, D)
    cond_x = part.new_zeros(b, n, part.shape[-1])
    cond_x[rows] = part
    return cond_x * mask, mask


def merge(x: torch.Tensor, cond_x: torch.Tensor | None, cond_mask: torch.Tensor | None) -> torch.Tensor:
    """X (B, N, D) with its known positions replaced by COND_X: the clean known latents."""
    if cond_mask is None or cond_x is None:
        return x
    m = cond_mask.to(x.dtype)
    return m * cond_x.to(x.dtype) + (1 - m) * x


def force_known(pred: torch.Tensor, ids: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Decoded tokens PRED (B, L) with the given IDS at KNOWN (B, L) token positions."""
    return torch.where(known, ids, pred)
