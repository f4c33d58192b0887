"""Picking tokens from logits: shared by the VAE's contextual decoder (tdiff/models/vae.py) and the
samplers (tdiff/sampling/sample.py), which import it from here (a lower layer never imports a higher one).

torch is imported inside the functions, so that importing this module costs nothing.
"""

from __future__ import annotations


def filter_logits(logits, temperature: float, top_k: int, top_p: float, generator):
    """Pick one token per position from LOGITS (..., V): argmax at temperature 0, else sampled
    from the temperature-scaled distribution restricted to the top-k and the top-p nucleus
    (Holtzman et al. 2020)."""
    import torch

    if temperature <= 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_l, order = logits.sort(-1, descending=True)
        probs = sorted_l.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p                      # keep the smallest set reaching top_p
        sorted_l = sorted_l.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_l)
    probs = logits.softmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def penalize_seen(logits, seen, penalty: float):
    """LOGITS (B, V) with the logits of the tokens SEEN (B, V) bool lowered: divided by PENALTY where
    positive, multiplied where negative (CTRL's repetition penalty, Keskar et al. 2019 §4.1: the
    tokens already in the row's context)."""
    import torch

    if penalty == 1.0:
        return logits
    scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, scaled, logits)
