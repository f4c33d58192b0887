"""What an artifact is, read from its headers alone (`tdiff info`): no tensor is loaded.

`describe(path)` returns one JSON-ready dict for any file or directory tdiff writes:
  vae | model | student | export | checkpoint   a safetensors file (tdiff/files/artifacts.py)
  ar                                            a `tdiff train-ar` directory (tdiff/formats/ar_dir.py)
  export-dir                                    a `tdiff export` directory (its manifest)
  tokenizer                                     a SentencePiece model from `tdiff tokenize --model`
with its parameter counts, window, VAE decoder (parallel | contextual), tokenizer, schedule, training provenance (data fingerprint, steps,
minutes, seed, the tdiff version that wrote it) and sha256.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tdiff.core.errors import DataError, NoInputError

# bytes per element of the safetensors dtypes tdiff writes or may meet
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def describe(path) -> dict:
    """The description of the artifact at PATH (NoInputError when missing, DataError when it is
    nothing tdiff wrote)."""
    p = Path(path)
    if not p.exists():
        raise NoInputError(f"'{p}' does not exist")
    if p.is_dir():
        return _describe_dir(p)
    if _is_safetensors(p):
        return _describe_safetensors(p)
    if p.suffix == ".model" or p.with_name(p.name + ".json").exists():
        return _describe_tokenizer(p)
    raise DataError(f"'{p}' is not a file tdiff writes (a safetensors artifact or a tokenizer model)")


def _is_safetensors(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            return 0 < n < 100_000_000 and f.read(1) == b"{"
    except OSError:
        return False


def _decoder(vae: dict) -> dict:
    """The VAE's latents-to-tokens decoder from its config: {"kind": parallel | contextual}, with the
    contextual decoder's depth (a VAE file from before the choice has the parallel one)."""
    kind = vae.get("decoder", "parallel")
    return {"kind": kind, "ctx_layers": vae.get("ctx_layers")} if kind == "contextual" else {"kind": kind}


def _tensor_counts(header: dict) -> dict:
    """Parameters (elements) and bytes per top-level prefix ('vae', 'dit', 'dit_ema', …) of a
    safetensors header."""
    out: dict = {}
    for name, t in header.items():
        if name == "__metadata__" or not isinstance(t, dict):
            continue
        n = math.prod(t.get("shape") or [1])
        head = name.split(".", 1)[0]
        c = out.setdefault(head, {"parameters": 0, "bytes": 0})
        c["parameters"] += n
        c["bytes"] += n * _DTYPE_BYTES.get(t.get("dtype"), 4)
    return out


def _json_field(path, meta: dict, key: str) -> dict:
    try:
        v = json.loads(meta.get(key, "{}"))
    except ValueError:
        raise DataError(f"{path}: its '{key}' metadata is not valid JSON") from None
    return v if isinstance(v, dict) else {}


def _provenance(train: dict, version: str | None) -> dict:
    """Steps, minutes, seed, data fingerprint and the tdiff version of a `train` entry."""
    elapsed = train.get("elapsed_s")
    return {"steps": train.get("steps"),
            "minutes": round(elapsed / 60, 3) if isinstance(elapsed, (int, float)) else None,
            "seed": train.get("seed"), "data": train.get("data"),
            "interrupted": train.get("interrupted"), "tdiff_version": version}


def _describe_safetensors(p: Path) -> dict:
    from tdiff.files.artifacts import read_header
    from tdiff.files.streams import file_sha256

    header = read_header(p)
    meta = header.get("__metadata__") or {}
    if "tdiff.kind" not in meta:
        raise DataError(f"{p}: a safetensors file but not a tdiff artifact (no tdiff.kind metadata)")
    kind = meta["tdiff.kind"]
    config = _json_field(p, meta, "config")
    train = _json_field(p, meta, "train")
    counts = _tensor_counts(header)
    out = {"file": str(p), "kind": kind, "format": meta.get("tdiff.format"), "bytes": p.stat().st_size,
           "sha256": file_sha256(p), "parameters": {k: v["parameters"] for k, v in sorted(counts.items())},
           "parameters_total": sum(v["parameters"] for v in counts.values())}
    vae = config.get("vae") if isinstance(config.get("vae"), dict) else None
    if vae:
        stride = vae.get("latent_stride", 1) or 1
        out["window"] = {"tokens": vae.get("max_len"),
                         "latents": [vae["max_len"] // stride if isinstance(vae.get("max_len"), int) else None,
                                     vae.get("latent_dim")]}
        out["decoder"] = _decoder(vae)
    if isinstance(config.get("dit"), dict):
        d = config["dit"]
        out["denoiser"] = {k: d.get(k) for k in ("d_model", "n_layers", "n_heads", "num_labels") if k in d}
        # block-causal diffusion: latent positions per block (the window for the parallel model)
        out["denoiser"]["block_size"] = d.get("block_size") or d.get("max_len")
    if isinstance(config.get("schedule"), dict):
        out["schedule"] = config["schedule"].get("name")
    if isinstance(config.get("diffusion"), dict):
        out["diffusion"] = config["diffusion"]
    if isinstance(config.get("labels"), dict):
        out["labels"] = config["labels"].get("names")
    if isinstance(config.get("student"), dict):
        s = config["student"]
        out["student"] = {k: s.get(k) for k in ("method", "steps", "solver", "from_steps", "teacher")}
    if "tokenizer" in meta:
        tm = _json_field(p, meta, "tokenizer.meta")
        out["tokenizer"] = {"vocab_size": vae.get("vocab_size") if vae else tm.get("vocab_size"),
                            **{k: tm[k] for k in ("model_type", "pretokenize", "character_coverage") if k in tm}}
    if kind == "checkpoint":                     # its train entry is the loop's state (tdiff/training/loop.py)
        loop = train.get("loop") if isinstance(train.get("loop"), dict) else {}
        train = {"steps": train.get("step"), "elapsed_s": train.get("elapsed"), "seed": loop.get("seed"),
                 "data": config.get("data")}
    out["training"] = _provenance(train, meta.get("tdiff.version"))
    if isinstance(train.get("config"), dict):
        out["training"]["config"] = train["config"]
    for key in ("heldout", "heldout_loss"):
        if key in train:
            out["training"][key] = train[key]
    return out


def _describe_dir(p: Path) -> dict:
    if (p / "tdiff.json").is_file():
        return _describe_ar(p)
    from tdiff.formats.export_dir import MANIFEST, load_export

    if (p / MANIFEST).is_file():
        exp = load_export(p)                              # the manifest's seal and every file checked
        from tdiff.files.streams import file_sha256

        files = {**exp["files"], MANIFEST: {"bytes": (p / MANIFEST).stat().st_size,
                                            "sha256": file_sha256(p / MANIFEST)}}
        return {"file": str(p), "kind": "export-dir", "export": exp["config"],
                "files": {f: r["sha256"] for f, r in sorted(files.items())},
                "bytes": sum(r["bytes"] for r in files.values())}
    raise DataError(f"'{p}' is a directory that tdiff did not write (no tdiff.json, no export manifest)")


def _describe_ar(p: Path) -> dict:
    from tdiff.files.artifacts import read_header
    from tdiff.files.streams import file_sha256

    try:
        meta = json.loads((p / "tdiff.json").read_text(encoding="utf-8"))
        config = json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{p}: not a readable train-ar directory ({e})") from None
    if not isinstance(meta, dict) or meta.get("kind") != "ar" or not isinstance(config, dict):
        raise DataError(f"{p}: tdiff.json does not describe a train-ar directory")
    weights = p / "model.safetensors"
    counts = _tensor_counts(read_header(weights)) if weights.is_file() else {}
    train = meta.get("train") if isinstance(meta.get("train"), dict) else {}
    return {"file": str(p), "kind": "ar", "format": meta.get("format"),
            "bytes": sum(f.stat().st_size for f in p.iterdir() if f.is_file()),
            "sha256": file_sha256(weights) if weights.is_file() else None,
            "parameters_total": sum(v["parameters"] for v in counts.values()),
            "window": {"tokens": config.get("n_positions")},
            "model": {k: config.get(k) for k in ("model_type", "n_layer", "n_embd", "n_head", "vocab_size")},
            "tokenizer": {"vocab_size": config.get("vocab_size"), "file": meta.get("tokenizer")},
            "training": {**_provenance(train, meta.get("tdiff_version")),
                         **({"heldout": train["heldout"]} if "heldout" in train else {})}}


def _describe_tokenizer(p: Path) -> dict:
    from tdiff.files.streams import file_sha256
    from tdiff.text.tokenizer import Tokenizer

    tok = Tokenizer.load(p, option="FILE")
    return {"file": str(p), "kind": "tokenizer", "bytes": p.stat().st_size, "sha256": file_sha256(p),
            "tokenizer": {"vocab_size": tok.vocab_size, **{k: v for k, v in tok.meta.items()
                                                          if isinstance(v, (str, int, float, bool))}}}
