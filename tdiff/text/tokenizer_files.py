"""The files of a tokenizer on disk: tok.model, tok.vocab and the tok.model.json sidecar.

tok.model is a standard SentencePiece model (usable by `spm_encode`), tok.vocab
lists its pieces as `spm_train` writes them, and tok.model.json records how text
was pre-tokenized. This module names those paths and writes the three files.
"""

from __future__ import annotations

import json
from pathlib import Path


def meta_path(model_path) -> Path:
    """The sidecar JSON beside a model: tok.model -> tok.model.json."""
    return Path(str(model_path) + ".json")


def vocab_path_for(model_path) -> Path:
    """tok.model -> tok.vocab (as spm_train names it); other names get '.vocab' appended."""
    p = Path(model_path)
    return p.with_suffix(".vocab") if p.suffix == ".model" else Path(str(p) + ".vocab")


def vocab_text(sp) -> str:
    """The tok.vocab text: one 'piece<TAB>score' line per id, as spm_train writes it."""
    lines = []
    for i in range(sp.get_piece_size()):
        score = sp.get_score(i)
        lines.append(f"{sp.id_to_piece(i)}\t{score:g}\n")
    return "".join(lines)


def write_model_files(model_path, model_bytes: bytes, meta: dict, vocab: str) -> None:
    """tok.vocab, tok.model.json, then tok.model (last: its presence means 'trained'), each atomic."""
    from tdiff.files.streams import atomic_path

    model_path = Path(model_path)
    files = [
        (vocab_path_for(model_path), vocab.encode("utf-8")),
        (meta_path(model_path), (json.dumps(meta, ensure_ascii=False, indent=1) + "\n").encode("utf-8")),
        (model_path, model_bytes),
    ]
    for path, data in files:
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
