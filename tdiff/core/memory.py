"""Memory estimates, checked before a command allocates: a batch or a model that cannot fit is a usage
error naming the option (exit 2), not an out-of-memory crash (or the kernel's OOM killer) minutes later.

The estimates count the largest terms from the model's configuration, in float32 bytes:

- training state: TRAIN_STATE bytes per parameter (weights, gradients and Adam's two moments), and
  4 more for the EMA copy;
- training activations: batch × length × width × layers × TRAIN_ACT values, kept for the backward
  pass (Korthikanti et al. 2022 count about 17 per layer without the attention scores, which
  PyTorch's fused attention never holds; measured on the tiny presets on CPU: 20-25 with the
  self-conditioning pass and the output layer);
- inference activations: batch × length × width × INFER_ACT values alive at once (the residual
  stream, the MLP's input, and its 4·width hidden layer before and after the activation; measured:
  9.4 in bf16, 11 in fp32 on the tiny test model);
- output logits: batch × length × vocabulary × LOGIT_COPIES values where they are held whole
  (sampled decoding, the VAE's reconstruction loss).

Every constant is at or below what was measured, so a setting the estimate refuses does not fit;
settings near the edge are left to the allocator. An out-of-memory error that still happens becomes
one line and exit 1 (`out_of_memory_errors`).

Available memory: /proc/meminfo's MemAvailable on Linux (os.sysconf elsewhere) for the CPU, and
torch.cuda.mem_get_info on CUDA; on other devices nothing is checked.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from tdiff.core.errors import TdiffError, UsageError

GIB = 2 ** 30
BYTES = 4            # float32
TRAIN_STATE = 16     # bytes per trained parameter: weights, gradients, Adam's first and second moments
TRAIN_ACT = 16       # values per token, layer and unit of width kept for the backward pass
INFER_ACT = 9        # values per token and unit of width alive at once without gradients
LOGIT_COPIES = 2     # (B, L, V) logits held at once: the logits and their softmax (or their gradient)
VAE_BLOCK = 12       # parameters per block, in width²: attention 4, MLP 8 (GELU ×4, or SwiGLU of the same size)
DIT_BLOCK = 18       # a DiT block adds its adaLN modulation (6 width²)


def transformer_params(width: int, layers: int, per_block: int = VAE_BLOCK, vocab: int = 0) -> int:
    """About the parameters of LAYERS blocks of WIDTH, plus an input embedding and an output layer
    over VOCAB tokens (0: none)."""
    return layers * per_block * width * width + 2 * vocab * width


def training_bytes(params: int, ema: bool) -> int:
    """The memory of PARAMS trained parameters with their gradients and optimizer state, and with
    an EMA copy when EMA."""
    return params * (TRAIN_STATE + (BYTES if ema else 0))


def activation_bytes(batch: int, length: int, width: int, layers: int = 1, *, training: bool,
                     vocab: int = 0) -> int:
    """The activations of a BATCH of LENGTH positions through LAYERS blocks of WIDTH: kept for the
    backward pass when TRAINING (per layer), else the peak of one block; plus the whole (B, L, VOCAB)
    logits when VOCAB is given."""
    per = TRAIN_ACT * layers if training else INFER_ACT
    return batch * length * (per * width + LOGIT_COPIES * vocab) * BYTES


def kv_cache_bytes(batch: int, positions: int, width: int, layers: int, vocab: int) -> int:
    """An autoregressive model's generation memory: keys and values of every layer for POSITIONS
    tokens, and one step's logits."""
    return batch * (2 * layers * positions * width + LOGIT_COPIES * vocab) * BYTES


def available(device) -> tuple[int, str] | None:
    """(bytes the command may still allocate on DEVICE, how to name the place), or None when unknown."""
    kind = getattr(device, "type", str(device))
    if kind == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return free, str(device)
    if kind != "cpu":
        return None
    room = _mem_available()
    return None if room is None else (room, "this machine")


def _mem_available() -> int | None:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else the free
    physical pages from os.sysconf; None when neither says."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def gib(n: float) -> str:
    """N bytes as 'N GiB' (one decimal below 10 GiB)."""
    x = n / GIB
    return f"{x:.0f} GiB" if x >= 10 else f"{x:.1f} GiB"


def check_fits(parts, device) -> None:
    """A UsageError when the PARTS, (bytes, what, option) triples, need more than DEVICE has
    available; it names the option of the largest part, the estimate and the parts that make up
    a tenth of it or more, e.g. '--batch-size 65536 needs about 25 GiB for activations; this machine
    has 23 GiB available'."""
    need = sum(p[0] for p in parts)
    room = available(device) if need > 0 else None
    if room is None or need <= room[0]:
        return
    shown = sorted((p for p in parts if p[0] * 10 >= need), key=lambda p: -p[0])
    what = (f" for {shown[0][1]}" if len(shown) == 1
            else ": " + " and ".join(f"{gib(b)} for {w}" for b, w, _ in shown))
    raise UsageError(f"{shown[0][2]} needs about {gib(need)}{what}; {room[1]} has {gib(room[0])} available")


def check_training(device, *, params: int, ema: bool, activations: int, preset: str, d_model: int, n_layers: int,
                   batch_option: str) -> None:
    """`check_fits` for a training command: PARAMS parameters in training (named by the options that
    size the model: --d-model and --n-layers where given, else --preset), and the ACTIVATIONS of its
    micro-batch (named by BATCH_OPTION)."""
    given = [f"{o} {v}" for o, v in (("--d-model", d_model), ("--n-layers", n_layers)) if v]
    size = " with ".join(given) or f"--preset {preset}"
    state = f"{params / 1e6:,.0f}M parameters in training (weights, gradients, Adam moments{', EMA' if ema else ''})"
    check_fits([(training_bytes(params, ema), state, size), (activations, "activations", batch_option)], device)


def is_out_of_memory(e: BaseException) -> bool:
    """Whether E is an allocation failure: MemoryError, torch's OutOfMemoryError, or the RuntimeError
    of a CPU or CUDA allocator that could not allocate (without importing torch)."""
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    msg = str(e)
    return isinstance(e, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


@contextmanager
def out_of_memory_errors(hint: str):
    """Turn an out-of-memory error in the block into one line and exit 1, with HINT (what to lower)."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:
        if not is_out_of_memory(e):
            raise
        raise TdiffError(f"out of memory ({hint})") from None
