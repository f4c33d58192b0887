"""The `Tokenizer` class: a SentencePiece model plus how its text was pre-tokenized.

A `Tokenizer` wraps a standard SentencePiece model (`tok.model`, usable by
`spm_encode`) plus a small sidecar `tok.model.json` that records how text was
pre-tokenized: {"format": 1, "pretokenize": "none" | "jieba"}. It loads and
saves them, encodes text to ids and decodes ids to text.

Round trip. Models trained by `tdiff.text.tokenizer_train.train` (identity
normalization, byte fallback, no dummy prefix, no whitespace folding) give
`decode(encode(text)) == text` for any text. Two details make it exact:

- SentencePiece shows spaces as U+2581 "▁" and turns a literal "▁" in the text
  into a space on decode. `encode` therefore writes each literal "▁" as its
  three UTF-8 byte pieces, which `decode` turns back into "▁".
- `decode` does not call SentencePiece: it maps every id to bytes (control and
  unknown pieces to nothing, byte pieces to their byte, other pieces to their
  text with "▁" as a space) and decodes with errors="ignore", so byte pieces
  that do not form valid UTF-8 are dropped, never shown as U+FFFD.

jieba. With pretokenize="jieba" (see `tdiff.text.pretokenize`), encoding gives
the same ids as encoding each jieba word on its own and concatenating, so no
piece crosses a word boundary. (It encodes the delimiter-joined words in one
batch call: no piece contains the delimiter, so it becomes its own byte pieces,
which are then removed.) Decoding needs no jieba: ids map straight back to text.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

from tdiff.core.errors import DataError, NoInputError
from tdiff.text.pretokenize import DELIMITER, init_jieba, jieba_words
from tdiff.text.tokenizer_files import meta_path, vocab_text, write_model_files

FORMAT = 1
PRETOKENIZERS = ("none", "jieba")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
SPACE_MARK = "\u2581"  # SentencePiece's visible space


class Tokenizer:
    """A SentencePiece model plus its pre-tokenization metadata."""

    def __init__(self, sp, model_bytes: bytes, meta: dict, num_threads: int = 1):
        self._sp = sp
        self._bytes = model_bytes
        self.meta = dict(meta)
        self.num_threads = num_threads
        self.pretokenize = self.meta.get("pretokenize", "none")
        self._table: list[bytes] | None = None
        # Literal "▁" is written as its byte pieces; that is unambiguous only while spaces have the
        # "▁" piece (tdiff's training makes sure: a model without it spells spaces with those bytes).
        has_space = sp.piece_to_id(SPACE_MARK) != sp.unk_id()
        self._mark_ids = _byte_ids(sp, SPACE_MARK) if has_space else None
        self._delim_ids = None
        if self.pretokenize == "jieba":
            d = _byte_ids(sp, DELIMITER)
            # The joined-words fast path needs the delimiter to be spelled by byte pieces only.
            if d is not None and not any(DELIMITER in sp.id_to_piece(i) for i in range(sp.get_piece_size())):
                self._delim_ids = d
        # Exact round trip for any text (models trained by tdiff.text.tokenizer_train.train are).
        self.lossless = self._mark_ids is not None

    # -- construction

    @classmethod
    def from_bytes(cls, model_bytes: bytes, meta: dict | None = None, num_threads: int = 1, name: str = "model",
                   hint: str = "point -t/--tokenizer at a .model file, or at a missing path to train a new one"):
        """A Tokenizer from serialized SentencePiece model bytes and a meta dict; HINT ends the
        error for bytes that are not a model (it names the option they came from)."""
        import sentencepiece as spm

        meta = check_meta(meta or {}, name)
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(bytes(model_bytes))
        except Exception:  # RuntimeError / OSError from the C++ parser
            raise DataError(f"{name} is not a SentencePiece model (it does not parse as one); {hint}") from None
        if sp.get_piece_size() <= 0:
            raise DataError(f"{name} is not a SentencePiece model (no pieces)")
        return cls(sp, bytes(model_bytes), meta, num_threads=num_threads)

    @classmethod
    def load(cls, path, num_threads: int = 1, option: str = "", hint: str = ""):
        """Read PATH (a .model file) and its sidecar PATH.json if present (else pretokenize none).
        OPTION: the command-line option PATH came from, named in errors (default: --model of
        tokenize); or HINT: the whole advice that ends such an error."""
        p = Path(path)
        if not p.exists():
            raise NoInputError(f"tokenizer model '{p}' does not exist")
        if p.is_dir():
            raise NoInputError(f"tokenizer model '{p}' is a directory, not a file")
        mp = meta_path(p)
        meta = {"format": FORMAT, "pretokenize": "none"}
        if mp.exists():
            try:
                meta = json.loads(mp.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise DataError(f"{mp}: not valid JSON ({e}); fix or delete it") from None
        hint = hint or (f"point {option} at the .model file written by `tdiff tokenize`" if option else "")
        kw = {"hint": hint} if hint else {}
        return cls.from_bytes(p.read_bytes(), meta, num_threads=num_threads, name=f"'{p}'", **kw)

    def to_bytes(self) -> bytes:
        """The serialized SentencePiece model (the content of tok.model)."""
        return self._bytes

    def save(self, model_path) -> None:
        """Write tok.model, tok.vocab and tok.model.json atomically."""
        write_model_files(model_path, self._bytes, self.meta, vocab_text(self._sp))

    # -- properties

    @property
    def sp(self):
        """The underlying sentencepiece.SentencePieceProcessor."""
        return self._sp

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def unk_id(self) -> int:
        return self._sp.unk_id()

    @property
    def bos_id(self) -> int:
        return self._sp.bos_id()

    @property
    def eos_id(self) -> int:
        return self._sp.eos_id()

    @property
    def pad_id(self) -> int:
        return self._sp.pad_id()

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(i)

    # -- encoding

    def segments(self, text: str) -> list[str]:
        """The pieces of TEXT that are encoded independently (jieba words, or the whole text)."""
        if self.pretokenize == "jieba":
            init_jieba()
            return jieba_words(text)
        return [text]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text; one SentencePiece batch call (threads: self.num_threads)."""
        texts = list(texts)
        mark = self._mark_ids
        if self.pretokenize == "none":
            if mark is None or not any(SPACE_MARK in t for t in texts):
                return self._sp.encode(texts, num_threads=self.num_threads)
            return self._encode_segmented(texts)
        delim = self._delim_ids
        if delim is None:
            return self._encode_segmented(texts)
        # jieba: encode the delimiter-joined words in one call. No piece contains the delimiter, so it
        # comes out as its own four byte pieces, cutting the text exactly at the word boundaries (the
        # same ids as encoding word by word); then drop those byte pieces. Texts holding a literal
        # "▁" or delimiter take the word-by-word path.
        init_jieba()
        out: list = [None] * len(texts)
        joined: list[str] = []
        where: list[int] = []
        slow: list[int] = []
        for k, t in enumerate(texts):
            if SPACE_MARK in t or DELIMITER in t:
                slow.append(k)
            else:
                joined.append(DELIMITER.join(jieba_words(t)))
                where.append(k)
        d0, tail = delim[0], delim[1:]
        for k, ids in zip(where, self._sp.encode(joined, num_threads=self.num_threads)):
            out[k] = _drop_delimiters(ids, d0, tail)
        if slow:
            for k, ids in zip(slow, self._encode_segmented([texts[k] for k in slow])):
                out[k] = ids
        return out

    def _encode_segmented(self, texts: list[str]) -> list[list[int]]:
        """Encode segment by segment: jieba words, and literal "▁" written as its byte pieces."""
        mark = self._mark_ids
        flat: list[str] = []
        spans: list[tuple[int, int]] = []
        for t in texts:
            start = len(flat)
            for seg in self.segments(t):
                if mark is not None and SPACE_MARK in seg:
                    for k, part in enumerate(seg.split(SPACE_MARK)):
                        if k:
                            flat.append(SPACE_MARK)
                        if part:
                            flat.append(part)
                else:
                    flat.append(seg)
            spans.append((start, len(flat)))
        if mark is not None:
            enc = self._sp.encode(["" if s == SPACE_MARK else s for s in flat], num_threads=self.num_threads)
            for j, s in enumerate(flat):
                if s == SPACE_MARK:
                    enc[j] = mark
        else:
            enc = self._sp.encode(flat, num_threads=self.num_threads)
        out = []
        for a, b in spans:
            if b - a == 1:
                out.append(enc[a])
            else:
                ids: list[int] = []
                for j in range(a, b):
                    ids.extend(enc[j])
                out.append(ids)
        return out

    # -- decoding

    def _byte_table(self) -> list[bytes]:
        """The bytes of each id: nothing for control/unknown/unused pieces, a byte piece's byte,
        else the piece's text with "▁" as a space (UTF-8)."""
        if self._table is None:
            sp = self._sp
            table = []
            for i in range(sp.get_piece_size()):
                if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                    table.append(b"")
                elif sp.is_byte(i):
                    table.append(bytes([int(sp.id_to_piece(i)[3:5], 16)]))
                else:
                    table.append(sp.id_to_piece(i).replace(SPACE_MARK, " ").encode("utf-8"))
            self._table = table
        return self._table

    def check_ids(self, ids) -> str | None:
        """None when IDS is a list of ints in [0, vocab_size); else what is wrong with it."""
        if not isinstance(ids, list):
            return f"ids must be a list of integers, got {type(ids).__name__}"
        for i in ids:
            if type(i) is not int:
                return f"ids must be integers, got {json.dumps(i)}"
        if ids:
            lo, hi = min(ids), max(ids)
            if lo < 0 or hi >= self.vocab_size:
                bad = lo if lo < 0 else hi
                return f"id {bad} is outside the vocabulary (0..{self.vocab_size - 1}); wrong -t/--tokenizer?"
        return None

    def decode(self, ids: Iterable[int]) -> str:
        """Text of IDS; pad/bos/eos/unk add nothing; invalid UTF-8 from byte pieces is dropped.

        Raises ValueError for ids that are not integers in [0, vocab_size).
        """
        ids = list(ids)
        problem = self.check_ids(ids)
        if problem:
            raise ValueError(problem)
        return self.decode_bytes(ids).decode("utf-8", errors="ignore")

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The UTF-8 bytes IDS stand for, before decoding: pad/bos/eos/unk add nothing, byte
        pieces add their byte, so the result need not be valid UTF-8.

        Does not check IDS (for speed on ids already checked): call `check_ids` first, since an
        id outside [0, vocab_size) raises IndexError or, when negative, picks a wrong piece.
        """
        table = self._byte_table()
        return b"".join([table[i] for i in ids])

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]


def _byte_ids(sp, char: str) -> list[int] | None:
    """Ids of the byte pieces that spell CHAR in UTF-8, or None when the model lacks them."""
    n = sp.get_piece_size()
    ids = [sp.piece_to_id(f"<0x{b:02X}>") for b in char.encode("utf-8")]
    return ids if all(0 <= i < n and sp.is_byte(i) for i in ids) else None


def _drop_delimiters(ids: list[int], d0: int, tail: list[int]) -> list[int]:
    """IDS without each run d0 + TAIL (the byte pieces of the jieba delimiter)."""
    if d0 not in ids:
        return ids
    out: list[int] = []
    i = 0
    k = len(tail)
    while True:
        try:
            j = ids.index(d0, i)
        except ValueError:
            out.extend(ids[i:])
            return out
        if ids[j + 1 : j + 1 + k] == tail:
            out.extend(ids[i:j])
            i = j + 1 + k
        else:
            out.extend(ids[i : j + 1])
            i = j + 1


def check_meta(meta: dict, name: str = "model") -> dict:
    if not isinstance(meta, dict):
        raise DataError(f"{name}: tokenizer metadata must be a JSON object")
    fmt = meta.get("format", FORMAT)
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise DataError(f"{name}: tokenizer metadata format {fmt!r} is newer than this tdiff reads ({FORMAT}); upgrade tdiff")
    pre = meta.get("pretokenize", "none")
    if pre not in PRETOKENIZERS:
        raise DataError(f"{name}: unknown pretokenize {pre!r} in tokenizer metadata (known: {', '.join(PRETOKENIZERS)})")
    out = dict(meta)
    out["format"] = FORMAT
    out["pretokenize"] = pre
    return out
