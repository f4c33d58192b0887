"""The inputs of `tdiff eval`: sample, reference and real-text records, held-out ids, what a model
path holds, and the training data's units for memorization."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tdiff.core.errors import DataError, NoInputError
from tdiff.files.streams import display_name, iter_jsonl, require_field


@dataclass
class TextRecords:
    """Texts of a JSONL file, with their ids when every record has an 'ids' list."""

    path: str
    texts: list
    ids: list | None          # list[list[int]] when every record has ids, else None
    requests: list | None = None   # per record, the control request it answers ({"prompt"} or {"source", "mask"}) or None
    labels: list | None = None     # per record, its "label" (str) or None; None when no record has one


def read_texts(path, need_text: bool = True, max_records: int = 0, opt: str = "input") -> TextRecords:
    """Records {"text": str, optionally "ids": [int]} from PATH (missing file: exit 66, bad line: exit 65).

    With NEED_TEXT false a record may have ids only (its text is then "").
    """
    name = display_name(path)
    if path is not None and str(path) != "-" and not Path(path).exists():
        raise NoInputError(f"{opt} file '{path}' does not exist")
    texts, ids, all_ids = [], [], True
    requests, labels = [], []
    for n, rec in iter_jsonl(path):
        if max_records and len(texts) >= max_records:
            break
        if need_text or "ids" not in rec:
            texts.append(require_field(rec, "text", str, name, n))
        else:
            t = rec.get("text", "")
            texts.append(t if isinstance(t, str) else "")
        r = rec.get("ids")
        if isinstance(r, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in r):
            ids.append(r)
        elif r is not None:
            raise DataError(f"{name}:{n}: field 'ids' must be a list of integers")
        else:
            all_ids = False
        requests.append(_request_of(rec, name, n))
        lab = rec.get("label")
        if lab is not None and not isinstance(lab, str):
            raise DataError(f"{name}:{n}: field 'label' must be a string")
        labels.append(lab)
    return TextRecords(name, texts, ids if all_ids and texts else None,
                       requests if any(q is not None for q in requests) else None,
                       labels if any(x is not None for x in labels) else None)


def _request_of(rec: dict, name: str, n: int) -> dict | None:
    """The control request a sample record of `tdiff sample` carries: {"prompt"}, {"source", "mask"}, or None."""
    if isinstance(rec.get("prompt"), str):
        return {"prompt": rec["prompt"]}
    if isinstance(rec.get("source"), str) and "mask" in rec:
        mask = rec["mask"]
        ok = isinstance(mask, list) and all(
            isinstance(m, list) and len(m) == 2 and all(isinstance(v, int) for v in m) for m in mask)
        if not ok:
            raise DataError(f"{name}:{n}: field 'mask' must be a list of [start, end] character offsets")
        return {"source": rec["source"], "mask": mask}
    return None


def read_heldout_ids(path, vocab_size: int, max_records: int = 0) -> list:
    """Token sequences of an ids JSONL file; ids outside VOCAB_SIZE are a DataError naming the line."""
    from tdiff.data.token_ids import read_ids

    if str(path) != "-" and not Path(path).exists():
        raise NoInputError(f"--data '{path}' does not exist")
    seqs = read_ids(path, vocab_size=vocab_size).seqs
    if max_records:
        seqs = seqs[:max_records]
    if not seqs:
        raise DataError(f"{display_name(path)}: no non-empty 'ids' records to evaluate on")
    return seqs


def model_kind(path) -> str:
    """'ar' (a train-ar directory), 'model' (VAE + denoiser) or 'vae' for --model PATH."""
    from tdiff.formats.ar_dir import check_ar_dir
    from tdiff.files.artifacts import read_metadata

    p = Path(path)
    if not p.exists():
        raise NoInputError(f"--model '{p}' does not exist")
    if p.is_dir():
        check_ar_dir(p)
        return "ar"
    meta = read_metadata(p)
    try:
        config = json.loads(meta.get("config", "{}"))
    except ValueError:
        raise DataError(f"{p}: bad config metadata") from None
    kind = meta.get("tdiff.kind")
    if kind not in ("vae", "model", "student"):
        raise DataError(f"{p}: is a {kind!r} file; give a vae or model file, or a train-ar directory")
    return "model" if "dit" in config else "vae"


def iter_train_units(path, use_ids: bool):
    """Token lists of the --train file: its 'ids' when USE_IDS, else the characters of its 'text'."""
    name = display_name(path)
    for n, rec in iter_jsonl(path):
        if use_ids:
            yield require_field(rec, "ids", list, name, n)
        else:
            yield list(require_field(rec, "text", str, name, n))


def first_record(path) -> dict | None:
    for _, rec in iter_jsonl(path):
        return rec
    return None
