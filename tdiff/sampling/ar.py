"""Sampling from the autoregressive baseline (tdiff.models.ar)."""

from __future__ import annotations

from typing import Iterator

from tdiff.core import memory
from tdiff.core.errors import UsageError
from tdiff.core.seeds import derive_seed
from tdiff.models.ar import _model_device, quiet_transformers


def generate_ar(model, tok, num: int, batch_size: int = 16, max_new_tokens: int = 0, temperature: float = 1.0,
                top_k: int = 0, top_p: float = 1.0, seed: int = 0, device=None,
                dtype: str = "fp32", prompt: list[int] | None = None) -> Iterator[dict]:
    """Yield NUM records {"text", "ids", "index", "seed"} sampled from [bos] + PROMPT (token ids,
    kept at the start of each record's ids and text).

    `model.generate` with the KV cache; every sequence in a batch starts from the same
    prompt, so there is no left padding. Greedy at temperature 0, else sampling
    with temperature, top-k (0: off) and top-p (1: off). Generation stops at eos (cut off,
    with anything after it) or after MAX_NEW_TOKENS (0: as many as the positions allow).
    unk, bos and pad are never generated. Batch k is seeded with derive_seed(seed, k): the
    same seed, batch size, device and dtype give the same records.
    """
    import torch

    from tdiff.core.device import autocast
    from transformers import GenerationConfig

    if num < 0 or batch_size < 1:
        raise UsageError("--num must be ≥ 0 and --batch-size ≥ 1")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise UsageError("need --temperature ≥ 0, --top-k ≥ 0 and 0 < --top-p ≤ 1")
    prompt = list(prompt or [])
    limit = model.config.n_positions - 1 - len(prompt)
    if limit < 1:
        raise UsageError(f"--prompt: {len(prompt)} tokens leave no room in this model's "
                         f"{model.config.n_positions} positions")
    if max_new_tokens <= 0:
        max_new_tokens = limit
    if max_new_tokens > limit:
        raise UsageError(f"at most {limit} new tokens fit this model's {model.config.n_positions} positions "
                         f"after the prompt (asked for {max_new_tokens})")
    device = _model_device(model, device)
    bos, eos, pad = model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id
    specials = {bos, eos, pad, tok.unk_id}
    gen = dict(max_new_tokens=max_new_tokens, min_new_tokens=0, use_cache=True, bos_token_id=bos,
               eos_token_id=eos, pad_token_id=pad, suppress_tokens=sorted({tok.unk_id, bos, pad}))
    if temperature > 0:
        gen.update(do_sample=True, temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
    else:
        gen.update(do_sample=False)
    gconf = GenerationConfig(**gen)
    model.eval()
    done, k = 0, 0
    while done < num:
        b = min(batch_size, num - done)
        start = torch.tensor([[bos] + prompt] * b, dtype=torch.long, device=device)   # (B, 1 + P)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(derive_seed(seed, k))
            with torch.inference_mode(), autocast(device, dtype), quiet_transformers():
                out = model.generate(start, attention_mask=torch.ones_like(start), generation_config=gconf)
        rows = out[:, start.shape[1]:].cpu().tolist()                           # (B, ≤ max_new_tokens)
        for i, row in enumerate(rows):
            if eos in row:
                row = row[:row.index(eos)]
            ids = prompt + [int(t) for t in row if t not in specials]
            yield {"text": tok.decode(ids), "ids": ids, "index": done + i, "seed": seed}
        done += b
        k += 1


def check_memory(model, batch: int, positions: int, device, batch_size: int) -> None:
    """A UsageError naming --batch-size BATCH_SIZE when the KV cache of BATCH sequences of POSITIONS
    positions cannot fit DEVICE's memory (tdiff/core/memory.py)."""
    c = model.config
    memory.check_fits([(memory.kv_cache_bytes(batch, positions, c.n_embd, c.n_layer, c.vocab_size),
                        "the keys and values of every position", f"--batch-size {batch_size}")], device)
