"""The autoregressive baseline and perplexity judge: a GPT-2 causal LM from `transformers` over
tdiff's SentencePiece vocabulary (bos 1, eos 2, pad 3: the tokenizer's ids).

A sequence is [bos] + ids + [eos]; the model is scored on every position after bos (the ids and
the eos that ends the text), so perplexity counts the end of text like any other token. Its
directory on disk is tdiff/formats/ar_dir.py; sampling it tdiff/sampling/ar.py; scoring with it
tdiff/evaluation/perplexity.py. `transformers` is imported inside functions only: it costs
seconds, and `tdiff --help` must start fast.
"""

from __future__ import annotations

from contextlib import contextmanager

from tdiff.core.errors import UsageError

MAX_POSITIONS = 1024

# (n_layer, n_embd, n_head). base is a 6×512 GPT-2: ~23M parameters with an 8k vocabulary
# (19M in the blocks, 4M in the tied token embedding).
PRESETS = {
    "tiny": {"n_layer": 4, "n_embd": 256, "n_head": 4},
    "small": {"n_layer": 6, "n_embd": 384, "n_head": 6},
    "base": {"n_layer": 6, "n_embd": 512, "n_head": 8},
}


def make_config(vocab_size: int, n_positions: int, preset: str = "tiny", n_layer: int = 0, n_embd: int = 0,
                n_head: int = 0, dropout: float = 0.1, bos_id: int = 1, eos_id: int = 2, pad_id: int = 3):
    """A GPT2Config from a preset with explicit overrides (0: the preset's value).

    bos/eos/pad are always set: transformers 5.x defaults eos_token_id to GPT-2's 50256.
    """
    from transformers import GPT2Config

    if preset not in PRESETS:
        raise UsageError(f"--preset {preset!r}: choose one of {', '.join(PRESETS)}")
    size = dict(PRESETS[preset])
    for k, v in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head)):
        if v < 0:
            raise UsageError(f"--{k.replace('_', '-')} must be ≥ 1 (0: the preset's value)")
        if v:
            size[k] = v
    if size["n_embd"] % size["n_head"]:
        raise UsageError(f"--d-model {size['n_embd']} must be a multiple of --n-heads {size['n_head']}")
    if not 0 <= dropout < 1:
        raise UsageError("--dropout must be in [0, 1)")
    if not 2 <= n_positions <= MAX_POSITIONS:
        raise UsageError(f"--max-len {n_positions}: must be between 2 and {MAX_POSITIONS}")
    return GPT2Config(vocab_size=vocab_size, n_positions=n_positions, **size,
                      resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                      bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)


def build_model(config):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"    # transformers cannot tell from the class name; it warns otherwise
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = config.bos_token_id, config.eos_token_id, config.pad_token_id
    return model


@contextmanager
def quiet_transformers():
    """No transformers progress bars or advice on stderr (tdiff prints its own lines); errors still show.

    Silences e.g. the 'Loading weights' bar and generate's padding advice (a finished sequence is fed
    pad ids that are cut off afterwards).
    """
    from transformers.utils import logging as hf_logging

    bar, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------- the directory


def _model_device(model, device):
    import torch

    return torch.device(device) if device is not None else next(model.parameters()).device


# ---------------------------------------------------------------- generation


# ---------------------------------------------------------------- perplexity


def hidden_states(model, ids, pad_id: int, layer: int):
    """Frozen features of token ids for representation alignment: the output of block LAYER
    (0 = embeddings) at each position of IDS (B, L) (padded with PAD_ID, tdiff's pad), fed as
    [bos] + ids. Causal attention: a position's features depend on it and what precedes it,
    so right padding changes nothing at text positions. Returns (B, L, n_embd) float32, no grad."""
    import torch

    bos, mpad = model.config.bos_token_id, model.config.pad_token_id
    x = torch.where(ids == pad_id, torch.full_like(ids, mpad), ids)                  # (B, L)
    x = torch.cat([torch.full_like(ids[:, :1], bos), x], dim=1)[:, :model.config.n_positions]   # (B, 1 + L)
    with torch.no_grad():
        out = model(input_ids=x, output_hidden_states=True, use_cache=False)
    h = out.hidden_states[layer][:, 1:].float()                                      # (B, L, H)
    if h.shape[1] < ids.shape[1]:                                                    # beyond the model's positions
        h = torch.cat([h, h.new_zeros(h.shape[0], ids.shape[1] - h.shape[1], h.shape[2])], dim=1)
    return h


