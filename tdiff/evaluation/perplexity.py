"""Perplexity under the autoregressive baseline: held-out figures and the judge of samples."""

from __future__ import annotations

import math

from tdiff.models.ar import _model_device


def _score_rows(model, rows, device, batch_size: int, dtype: str) -> tuple[float, int]:
    """Summed NLL (nats, float64) and count of the tokens after the first of each row."""
    import torch

    from tdiff.core.device import autocast
    from tdiff.evaluation.metrics import perplexity_from_logits

    pad = model.config.pad_token_id
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))          # similar lengths share a batch
    nll, count = 0.0, 0
    model.eval()
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            chunk = [rows[i] for i in order[s:s + batch_size]]
            length = max(len(r) for r in chunk)
            ids = torch.full((len(chunk), length), pad, dtype=torch.long)      # (B, L), right-padded
            mask = torch.zeros((len(chunk), length), dtype=torch.long)
            for j, r in enumerate(chunk):
                ids[j, :len(r)] = torch.tensor(r, dtype=torch.long)
                mask[j, :len(r)] = 1
            ids, mask = ids.to(device), mask.to(device)
            with autocast(device, dtype):
                logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits   # (B, L, V)
            target = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)                         # (B, L-1)
            batch_nll, batch_count = perplexity_from_logits(logits[:, :-1], target, ignore_index=-100)
            nll += batch_nll
            count += batch_count
    return nll, count


def _rows(model, seqs, max_len: int = 0) -> list[list[int]]:
    n = model.config.n_positions
    max_len = min(max_len, n) if max_len > 0 else n
    bos, eos = model.config.bos_token_id, model.config.eos_token_id
    return [([bos] + list(s) + [eos])[:max_len] for s in seqs]


def heldout_perplexity(model, seqs, max_len: int = 0, device=None, batch_size: int = 32,
                       dtype: str = "fp32") -> tuple[float, float, int]:
    """(perplexity, summed NLL in nats, scored tokens) of token sequences SEQS (lists of ids).

    Each sequence is scored as [bos] + ids + [eos], cut to MAX_LEN positions (0: the model's),
    on the ids and the eos. Perplexity is exp(NLL / tokens); nan when nothing was scored.
    """
    device = _model_device(model, device)
    nll, count = _score_rows(model, _rows(model, seqs, max_len), device, batch_size, dtype)
    return (math.exp(nll / count) if count else float("nan")), nll, count


def judge_nll(model, tok, texts, device=None, batch_size: int = 32, dtype: str = "fp32") -> tuple[float, int]:
    """(summed NLL in nats, scored tokens) of TEXTS under a judge model, re-tokenized with the
    judge's own tokenizer TOK (bos + ids + eos; the ids and the eos are scored).

    Generative perplexity of a set of samples is exp(nll / tokens).
    """
    device = _model_device(model, device)
    seqs = tok.encode_batch(list(texts))
    return _score_rows(model, _rows(model, seqs), device, batch_size, dtype)
