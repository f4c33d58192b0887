"""The tdiff file format: self-describing safetensors artifacts. Nothing is ever unpickled.

Every layer of the package may use this module (it imports nothing from tdiff but
errors and io), so models, evaluation, sampling and training read and write one format.

Every file carries string metadata:
  tdiff.format  format version (int as string); newer versions are refused
  tdiff.kind    vae | model | student | export | checkpoint
  tdiff.version the tdiff that wrote it (files written before 2026-12-06 lack it)
  config        JSON: everything needed to rebuild the networks
  tokenizer     base64 SentencePiece model (+ tokenizer.meta JSON)
  train         JSON: steps, seed, data hash, metrics

Training checkpoints (kind `checkpoint`) also hold optimizer moments and RNG
state as tensors (see tdiff/training/checkpoints.py for how the trainer fills
them), so `--resume` continues exactly where the last checkpoint left off.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

from tdiff.core.errors import DataError, NoInputError
from tdiff.files.streams import atomic_path

FORMAT_VERSION = 1
KINDS = ("vae", "model", "student", "export", "checkpoint")


@dataclass
class Artifact:
    kind: str
    tensors: dict
    config: dict
    train: dict = field(default_factory=dict)
    tokenizer: bytes | None = None
    tokenizer_meta: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # other string metadata
    path: str = ""

    def sub(self, prefix: str) -> dict:
        """Tensors under 'prefix.' with the prefix removed (a module's state_dict)."""
        p = prefix + "."
        return {k[len(p):]: v for k, v in self.tensors.items() if k.startswith(p)}



def save_artifact(path, tensors: dict, kind: str, config: dict, train: dict | None = None,
                  tokenizer: bytes | None = None, tokenizer_meta: dict | None = None,
                  extra: dict | None = None) -> None:
    """Write tensors and metadata to PATH atomically (temp file + rename); a device or FIFO at PATH
    is written through, never replaced."""
    from safetensors.torch import save

    assert kind in KINDS, kind
    from tdiff.core.version import __version__

    meta = {
        "tdiff.format": str(FORMAT_VERSION),
        "tdiff.kind": kind,
        "tdiff.version": __version__,
        "config": json.dumps(config, sort_keys=True),
        "train": json.dumps(train or {}, sort_keys=True),
    }
    if tokenizer is not None:
        meta["tokenizer"] = base64.b64encode(tokenizer).decode("ascii")
        meta["tokenizer.meta"] = json.dumps(tokenizer_meta or {}, sort_keys=True)
    for k, v in (extra or {}).items():
        meta[k] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    # safetensors wants contiguous, non-shared tensors
    clean = {k: v.detach().contiguous().clone() if _shares(v, tensors, k) else v.detach().contiguous()
             for k, v in tensors.items()}
    data = save(clean, metadata=meta)          # bytes: safetensors' save_file would replace a device or FIFO
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def _shares(v, tensors, key) -> bool:
    ptr = v.data_ptr()
    return any(o is not v and o.data_ptr() == ptr for k, o in tensors.items() if k != key)


def read_metadata(path) -> dict:
    """The string metadata of a safetensors file, without loading tensors."""
    return read_header(path).get("__metadata__") or {}


def read_header(path) -> dict:
    """The whole safetensors header of PATH (tensor names → dtype, shape, offsets; and __metadata__),
    without loading tensors; DataError for anything that is not a safetensors file."""
    import struct

    p = Path(path)
    if not p.exists():
        raise NoInputError(f"model file '{p}' does not exist")
    if p.is_dir():
        raise DataError(f"'{p}' is a directory, not a model file (a .safetensors file written by tdiff)")
    try:
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n <= 0 or n > 100_000_000:
                raise ValueError
            header = json.loads(f.read(n))
    except (ValueError, struct.error, UnicodeDecodeError, RecursionError):
        raise DataError(f"{p}: not a safetensors file") from None
    if not isinstance(header, dict):
        raise DataError(f"{p}: not a safetensors file (its header is not a JSON object)")
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise DataError(f"{p}: not a safetensors file (bad __metadata__)")
    return header


def load_artifact(path, expect=None, device="cpu") -> Artifact:
    """Load a tdiff artifact; refuse other kinds and newer format versions with a clear DataError.

    EXPECT: a kind or tuple of kinds that the caller accepts (None: any).
    """
    from safetensors.torch import load_file

    meta = read_metadata(path)
    if "tdiff.kind" not in meta:
        raise DataError(f"{path}: a safetensors file but not a tdiff artifact (no tdiff.kind metadata)")
    kind = meta["tdiff.kind"]
    try:
        version = int(meta.get("tdiff.format", "0"))
    except ValueError:
        raise DataError(f"{path}: bad tdiff.format metadata {meta.get('tdiff.format')!r}") from None
    if version > FORMAT_VERSION:
        raise DataError(
            f"{path}: format version {version} is newer than this tdiff understands ({FORMAT_VERSION}); upgrade tdiff"
        )
    if expect is not None:
        allowed = (expect,) if isinstance(expect, str) else tuple(expect)
        if kind not in allowed:
            raise DataError(f"{path}: is a '{kind}' file, expected {' or '.join(repr(a) for a in allowed)}")
    try:
        tensors = load_file(str(path), device=str(device))
    except Exception as e:  # safetensors raises its own error types
        raise DataError(f"{path}: cannot read tensors ({e})") from None
    tok = meta.get("tokenizer")
    known = {"tdiff.format", "tdiff.kind", "tdiff.version", "config", "train", "tokenizer", "tokenizer.meta"}

    def field_json(name):
        try:
            v = json.loads(meta.get(name, "{}"))
        except (ValueError, RecursionError):
            raise DataError(f"{path}: its '{name}' metadata is not valid JSON") from None
        if not isinstance(v, dict):
            raise DataError(f"{path}: its '{name}' metadata is not a JSON object")
        return v

    try:
        tok_bytes = base64.b64decode(tok, validate=True) if tok else None
    except ValueError:  # binascii.Error
        raise DataError(f"{path}: its tokenizer metadata is not valid base64") from None
    return Artifact(
        kind=kind,
        tensors=tensors,
        config=field_json("config"),
        train=field_json("train"),
        tokenizer=tok_bytes,
        tokenizer_meta=field_json("tokenizer.meta"),
        extra={k: v for k, v in meta.items() if k not in known},
        path=str(path),
    )
