"""The autoregressive baseline and perplexity judge.

A GPT-2 causal LM from `transformers` over tdiff's SentencePiece vocabulary,
stored as a standard transformers directory so any transformers code loads it
offline (`AutoModelForCausalLM.from_pretrained(DIR)`):

    DIR/config.json              GPT2Config; bos 1, eos 2, pad 3 (the tokenizer's ids)
    DIR/generation_config.json
    DIR/model.safetensors        EMA weights, fp32
    DIR/tok.model                the SentencePiece model (+ tok.vocab, tok.model.json sidecar)
    DIR/tokenizer.json           the same vocabulary for `AutoTokenizer.from_pretrained(DIR)` (+ tokenizer_config.json):
                                 a fast tokenizer with our bos/eos/pad/unk, adding no special tokens itself;
                                 `transformers.pipeline("text-generation", model=DIR)` runs offline
    DIR/tdiff.json               {"format": 1, "kind": "ar", "tokenizer": "tok.model", "train": {...}}

A sequence is [bos] + ids + [eos]; the model is scored on every position after
bos (the ids and the eos that ends the text), so perplexity counts the end of
text like any other token. `transformers` is imported inside functions only:
it costs seconds, and `tdiff --help` must start fast.
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tdiff.errors import DataError, NoInputError, TdiffError, UsageError
from tdiff.seeds import derive_seed

FORMAT = 1
KIND = "ar"
META_FILE = "tdiff.json"
TOKENIZER_FILE = "tok.model"
WEIGHTS_FILE = "model.safetensors"     # the only weights read: never a pickled pytorch_model.bin
MAX_POSITIONS = 1024

# (n_layer, n_embd, n_head). base is a 6×512 GPT-2: ~23M parameters with an 8k vocabulary
# (19M in the blocks, 4M in the tied token embedding).
PRESETS = {
    "tiny": {"n_layer": 4, "n_embd": 256, "n_head": 4},
    "small": {"n_layer": 6, "n_embd": 384, "n_head": 6},
    "base": {"n_layer": 6, "n_embd": 512, "n_head": 8},
}


def write_transformers_tokenizer(directory, tok, model_max_length: int) -> None:
    """Write tokenizer.json + tokenizer_config.json into DIRECTORY so that transformers' AutoTokenizer
    (and so `pipeline`) loads tdiff's vocabulary offline: the SentencePiece model converted by
    transformers to a fast tokenizer, with our special pieces as bos/eos/pad/unk.

    Decoding equals `Tokenizer.decode`. Encoding equals `Tokenizer.encode` for tokenizers trained
    without pre-tokenization; for `--pretokenize jieba` ones AutoTokenizer does not segment with jieba
    first, so ids may differ where jieba moves a piece boundary (measured in docs/NOTES.md)."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    sp = tok._sp
    special = {"bos_token": tok.bos_id, "eos_token": tok.eos_id, "pad_token": tok.pad_id, "unk_token": tok.unk_id}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
              "model_max_length": model_max_length,
              **{k: sp.id_to_piece(i) for k, i in special.items() if i is not None and i >= 0}}
    with tempfile.TemporaryDirectory() as tmp, quiet_transformers():
        shutil.copyfile(Path(directory) / TOKENIZER_FILE, Path(tmp) / "tokenizer.model")
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        fast = AutoTokenizer.from_pretrained(tmp)
        fast.save_pretrained(str(directory))


def check_transformers_tokenizer(tok) -> None:
    """Convert TOK for AutoTokenizer into a scratch folder, before training: a transformers release
    that cannot convert it (a missing converter dependency, a changed API) fails in a second, not
    after the training. TdiffError naming the cause; nothing is kept."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tok.save(Path(tmp) / TOKENIZER_FILE)
        try:
            write_transformers_tokenizer(tmp, tok, MAX_POSITIONS)
        except Exception as e:
            import transformers

            raise TdiffError(f"transformers {transformers.__version__} cannot convert the tokenizer for "
                             f"AutoTokenizer ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                             "install the versions in constraints.txt (make install)") from None


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
        raise UsageError(f"--n-embd {size['n_embd']} must be a multiple of --n-head {size['n_head']}")
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


def read_meta(path) -> dict | None:
    """DIR/tdiff.json as a dict, or None when it is missing or unreadable."""
    try:
        meta = json.loads((Path(path) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_ar_dir(path) -> bool:
    """True when PATH is a directory written by `tdiff train-ar`."""
    p = Path(path)
    if not p.is_dir():
        return False
    meta = read_meta(p)
    return meta is not None and meta.get("kind") == KIND


def check_ar_dir(path) -> dict:
    """The tdiff.json of an AR directory; NoInputError / DataError saying what is wrong otherwise."""
    p = Path(path)
    if not p.exists():
        raise NoInputError(f"AR model '{p}' does not exist")
    hint = "give the directory written by `tdiff train-ar -o DIR`"
    if not p.is_dir():
        raise DataError(f"'{p}' is a file, not an AR model directory; {hint}")
    for name in (META_FILE, "config.json", TOKENIZER_FILE, WEIGHTS_FILE):
        if not (p / name).is_file():
            raise DataError(f"'{p}' has no {name}, so it is not a tdiff AR model directory; {hint}")
    meta = read_meta(p)
    if meta is None:
        raise DataError(f"{p / META_FILE}: not a JSON object; {hint}")
    if meta.get("kind") != KIND:
        raise DataError(f"{p / META_FILE}: kind is {meta.get('kind')!r}, expected 'ar'; {hint}")
    fmt = meta.get("format")
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise DataError(f"{p / META_FILE}: format {fmt!r} is newer than this tdiff understands ({FORMAT}); upgrade tdiff")
    return meta


def load_ar(path, device="cpu"):
    """(model in eval mode on DEVICE, Tokenizer) from an AR directory; never touches the network."""
    from tdiff.text.tokenizer import Tokenizer

    check_ar_dir(path)
    p = Path(path)
    tok = Tokenizer.load(p / TOKENIZER_FILE, hint="the AR model directory is damaged; train it again with `tdiff train-ar`")
    from transformers import AutoModelForCausalLM

    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, use_safetensors=True)
    except Exception as e:  # OSError, ValueError, safetensors errors: all mean a broken directory
        msg = str(e).strip().splitlines()
        raise DataError(f"'{p}': cannot load the transformers model ({msg[0] if msg else type(e).__name__})") from None
    if model.config.vocab_size != tok.vocab_size:
        raise DataError(f"'{p}': model vocabulary {model.config.vocab_size} does not match "
                        f"{TOKENIZER_FILE} ({tok.vocab_size} pieces)")
    model.loss_type = "ForCausalLM"
    return model.to(device).eval(), tok


def _model_device(model, device):
    import torch

    return torch.device(device) if device is not None else next(model.parameters()).device


# ---------------------------------------------------------------- generation


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

    from tdiff.device import autocast
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


# ---------------------------------------------------------------- perplexity


def _score_rows(model, rows, device, batch_size: int, dtype: str) -> tuple[float, int]:
    """Summed NLL (nats, float64) and count of the tokens after the first of each row."""
    import torch

    from tdiff.device import autocast
    from tdiff.metrics import perplexity_from_logits

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


def judge_nll(model, tok, texts, device=None, batch_size: int = 32, dtype: str = "fp32") -> tuple[float, int]:
    """(summed NLL in nats, scored tokens) of TEXTS under a judge model, re-tokenized with the
    judge's own tokenizer TOK (bos + ids + eos; the ids and the eos are scored).

    Generative perplexity of a set of samples is exp(nll / tokens).
    """
    device = _model_device(model, device)
    seqs = tok.encode_batch(list(texts))
    return _score_rows(model, _rows(model, seqs), device, batch_size, dtype)
