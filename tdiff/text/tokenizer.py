"""SentencePiece tokenizer with an exact round trip, optionally on jieba word boundaries.

A `Tokenizer` wraps a standard SentencePiece model (`tok.model`, usable by
`spm_encode`) plus a small sidecar `tok.model.json` that records how text was
pre-tokenized: {"format": 1, "pretokenize": "none" | "jieba"}.

Round trip. `train` builds models with identity normalization, byte fallback,
no dummy prefix and no whitespace folding, so for any text
`decode(encode(text)) == text`. Two details make it exact:

- SentencePiece shows spaces as U+2581 "▁" and turns a literal "▁" in the text
  into a space on decode. `encode` therefore writes each literal "▁" as its
  three UTF-8 byte pieces, which `decode` turns back into "▁".
- `decode` does not call SentencePiece: it maps every id to bytes (control and
  unknown pieces to nothing, byte pieces to their byte, other pieces to their
  text with "▁" as a space) and decodes with errors="ignore", so byte pieces
  that do not form valid UTF-8 are dropped, never shown as U+FFFD.

jieba. With pretokenize="jieba" each text is cut into words by jieba
(HMM=False, which loses nothing: the words join back to the text), a single
space is glued to the word after it ("▁word" as SentencePiece likes it), and:
- training sees the words joined by a private-use delimiter that the trainer's
  `pretokenization_delimiter` removes again, so no piece spans two words;
- encoding gives the same ids as encoding each word on its own and
  concatenating, so no piece crosses a word boundary at encode time either.
  (It encodes the delimiter-joined words in one batch call: no piece contains
  the delimiter, so it becomes its own byte pieces, which are then removed.)
Decoding needs no jieba: ids map straight back to text.

Small vocabularies. SentencePiece refuses a vocabulary with fewer free slots
than the characters --character-coverage keeps (0.98 at the lowest), which
rules out e.g. 600 pieces for Chinese. `train` then keeps only the most
frequent characters that fit and turns the others into cut points of the
training text; at encode time they fall back to byte pieces, so nothing is lost.
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from tdiff.errors import DataError, NoInputError, TdiffError, UsageError

FORMAT = 1
PRETOKENIZERS = ("none", "jieba")
MODEL_TYPES = ("unigram", "bpe")
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3
SPACE_MARK = "\u2581"  # SentencePiece's visible space
DELIMITER = "\U000f0000"  # plane-15 private use: jieba word delimiter seen only by the trainer
MIN_COVERAGE = 0.98  # SentencePiece refuses a lower --character_coverage
TRAIN_CHUNK_CHARS = 8192  # longer texts are cut into pieces of this size for training only
MAX_SENTENCE_BYTES = 1 << 16
CHAR_SHARE = 0.8  # when characters overflow a small vocabulary: share of its free slots given to characters


def meta_path(model_path) -> Path:
    """The sidecar JSON beside a model: tok.model -> tok.model.json."""
    return Path(str(model_path) + ".json")


def cache_dir() -> Path:
    """tdiff's cache folder: $XDG_CACHE_HOME/tdiff or ~/.cache/tdiff."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tdiff"


# ---------------------------------------------------------------- jieba

_jieba_ready = False


def init_jieba(quiet: bool | None = None) -> None:
    """Load jieba once per process; its dictionary cache goes to tdiff's cache folder.

    jieba's own log lines reach stderr unless QUIET (default: tdiff's --quiet).
    """
    global _jieba_ready
    if _jieba_ready:
        return
    import logging

    import jieba

    if quiet is None:
        from tdiff import log

        quiet = log.is_quiet()

    jieba.setLogLevel(logging.WARNING if quiet else logging.DEBUG)
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        if not os.access(d, os.W_OK):
            raise OSError
        jieba.dt.tmp_dir = str(d)
    except OSError:
        jieba.dt.tmp_dir = tempfile.gettempdir()
    jieba.initialize()
    _jieba_ready = True


def jieba_words(text: str) -> list[str]:
    """jieba words of TEXT (concatenating to TEXT exactly), a single space glued to the next word."""
    import jieba

    words = jieba.lcut(text, HMM=False)
    if "".join(words) != text:  # never seen; keep the guarantee anyway
        return [text] if text else []
    out: list[str] = []
    carry = ""
    for w in words:
        if w == " ":
            if carry:
                out.append(carry)
            carry = " "
        else:
            out.append(carry + w)
            carry = ""
    if carry:
        out.append(carry)
    return out


def _segment_for_training(text: str) -> str:
    return DELIMITER.join(jieba_words(text.replace(DELIMITER, "")))


def _pool_init_jieba() -> None:
    init_jieba(quiet=True)


def _segment_batch(texts: list[str]) -> list[str]:
    return [_segment_for_training(t) for t in texts]


def segment_for_training(texts: Sequence[str], jobs: int = 1) -> list[str]:
    """Delimiter-joined jieba words of each text (in order), using JOBS processes."""
    init_jieba()
    if jobs <= 1 or len(texts) < 2000:
        return [_segment_for_training(t) for t in texts]
    step = 500
    batches = [list(texts[i : i + step]) for i in range(0, len(texts), step)]
    with pool_context().Pool(jobs, initializer=_pool_init_jieba) as pool:
        out: list[str] = []
        for part in pool.imap(_segment_batch, batches):
            out.extend(part)
    return out


def pool_context():
    """fork where it exists (workers inherit loaded models and jieba), else spawn."""
    import multiprocessing as mp

    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


# ---------------------------------------------------------------- tokenizer


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
        # Exact round trip for any text (models trained by tdiff.text.tokenizer.train are).
        self.lossless = self._mark_ids is not None

    # -- construction

    @classmethod
    def from_bytes(cls, model_bytes: bytes, meta: dict | None = None, num_threads: int = 1, name: str = "model"):
        """A Tokenizer from serialized SentencePiece model bytes and a meta dict."""
        import sentencepiece as spm

        meta = check_meta(meta or {}, name)
        sp = spm.SentencePieceProcessor()
        try:
            sp.LoadFromSerializedProto(bytes(model_bytes))
        except Exception:  # RuntimeError / OSError from the C++ parser
            raise DataError(
                f"{name} is not a SentencePiece model (it does not parse as one); "
                "point --model at a .model file, or at a missing path to train a new one"
            ) from None
        if sp.get_piece_size() <= 0:
            raise DataError(f"{name} is not a SentencePiece model (no pieces)")
        return cls(sp, bytes(model_bytes), meta, num_threads=num_threads)

    @classmethod
    def load(cls, path, num_threads: int = 1):
        """Read PATH (a .model file) and its sidecar PATH.json if present (else pretokenize none)."""
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
        return cls.from_bytes(p.read_bytes(), meta, num_threads=num_threads, name=f"'{p}'")

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
                return f"id {bad} is outside the vocabulary (0..{self.vocab_size - 1}); wrong --model?"
        return None

    def decode(self, ids: Iterable[int]) -> str:
        """Text of IDS; pad/bos/eos/unk add nothing; invalid UTF-8 from byte pieces is dropped.

        Raises ValueError for ids that are not integers in [0, vocab_size).
        """
        ids = list(ids)
        problem = self.check_ids(ids)
        if problem:
            raise ValueError(problem)
        table = self._byte_table()
        return b"".join([table[i] for i in ids]).decode("utf-8", errors="ignore")

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


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


# ---------------------------------------------------------------- files


def vocab_text(sp) -> str:
    """The tok.vocab text: one 'piece<TAB>score' line per id, as spm_train writes it."""
    lines = []
    for i in range(sp.get_piece_size()):
        score = sp.get_score(i)
        lines.append(f"{sp.id_to_piece(i)}\t{score:g}\n")
    return "".join(lines)


def vocab_path_for(model_path) -> Path:
    """tok.model -> tok.vocab (as spm_train names it); other names get '.vocab' appended."""
    p = Path(model_path)
    return p.with_suffix(".vocab") if p.suffix == ".model" else Path(str(p) + ".vocab")


def write_model_files(model_path, model_bytes: bytes, meta: dict, vocab: str) -> None:
    """tok.vocab, tok.model.json, then tok.model (last: its presence means 'trained'), each atomic."""
    from tdiff.io import atomic_path

    model_path = Path(model_path)
    files = [
        (vocab_path_for(model_path), vocab.encode("utf-8")),
        (meta_path(model_path), (json.dumps(meta, ensure_ascii=False, indent=1) + "\n").encode("utf-8")),
        (model_path, model_bytes),
    ]
    for path, data in files:
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)


# ---------------------------------------------------------------- training


def reservoir_sample(items: Iterable, k: int, seed: int = 0) -> tuple[list, int]:
    """Up to K items drawn uniformly (Algorithm R) with SEED; returns (sample, number of items seen).

    When there are at most K items, all of them come back in their order.
    """
    rng = random.Random(seed)
    sample: list = []
    n = 0
    for x in items:
        if n < k:
            sample.append(x)
        else:
            j = rng.randrange(n + 1)
            if j < k:
                sample[j] = x
        n += 1
    return sample, n


def _training_sentences(texts: Iterable[str]) -> Iterator[str]:
    """Non-empty texts, long ones cut into TRAIN_CHUNK_CHARS pieces (at delimiters where possible)."""
    for t in texts:
        while len(t) > TRAIN_CHUNK_CHARS:
            cut = t.rfind(DELIMITER, 0, TRAIN_CHUNK_CHARS)
            if cut <= 0:
                cut = TRAIN_CHUNK_CHARS
            yield t[:cut]
            t = t[cut:].lstrip(DELIMITER)
        if t:
            yield t


def train(
    texts: Iterable[str],
    model_path=None,
    vocab_size: int = 8000,
    model_type: str = "unigram",
    pretokenize: str = "none",
    seed: int = 0,
    character_coverage: float = 0.9995,
    jobs: int = 1,
    user_defined_symbols: Sequence[str] = (),
    verbose: bool = False,
) -> Tokenizer:
    """Train a lossless SentencePiece model on TEXTS; write MODEL_PATH (+ .vocab, .model.json) when given.

    Deterministic for the same texts, options and JOBS (JOBS also sets the trainer's threads).
    Raises UsageError when the vocabulary does not fit the data, DataError when there is no text.
    """
    if model_type not in MODEL_TYPES:
        raise UsageError(f"--model-type must be one of {', '.join(MODEL_TYPES)}, got {model_type!r}")
    if pretokenize not in PRETOKENIZERS:
        raise UsageError(f"--pretokenize must be one of {', '.join(PRETOKENIZERS)}, got {pretokenize!r}")
    if not (MIN_COVERAGE <= character_coverage <= 1.0):
        raise UsageError(f"--character-coverage must be between {MIN_COVERAGE} and 1.0, got {character_coverage}")
    n_meta = 4 + 256 + len(user_defined_symbols)
    if vocab_size <= n_meta:
        raise UsageError(f"--vocab-size {vocab_size} is too small: 4 special and 256 byte pieces come first; use at least {n_meta + 40}")

    texts = [t for t in texts if t]
    if pretokenize == "jieba":
        texts = segment_for_training(texts, jobs=jobs)
    sentences = list(_training_sentences(texts))
    if not sentences:
        raise DataError("no text to train the tokenizer on (the input has no non-empty 'text'); give some text or an existing --model")

    opts = dict(
        model_type=model_type,
        vocab_size=vocab_size,
        character_coverage=character_coverage,
        normalization_rule_name="identity",
        byte_fallback=True,
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        split_digits=True,
        required_chars=SPACE_MARK,  # spaces always have a piece, even in text without any
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=PAD_ID,
        pad_piece="<pad>",
        max_sentence_length=MAX_SENTENCE_BYTES,
        input_sentence_size=0,
        num_threads=max(1, jobs),
        minloglevel=0 if verbose else 2,
    )
    if user_defined_symbols:
        opts["user_defined_symbols"] = list(user_defined_symbols)
    if pretokenize == "jieba":
        opts["pretokenization_delimiter"] = DELIMITER
    meta = {
        "format": FORMAT,
        "pretokenize": pretokenize,
        "model_type": model_type,
        "vocab_size": vocab_size,
        "character_coverage": character_coverage,
        "seed": seed,
    }
    try:
        try:
            model_bytes = _run_trainer(sentences, opts, seed)
        except RuntimeError as e:
            m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", str(e))
            if not m:
                raise
            # The text holds fewer pieces than asked for (small corpus, or jieba words as hard
            # boundaries): learn all there are, as `hard_vocab_limit=false` does, and say so.
            from tdiff import log

            opts["hard_vocab_limit"] = False
            model_bytes = _run_trainer(sentences, opts, seed)
            log.warn(f"--vocab-size {vocab_size}: this text yields at most {m.group(2)} pieces; "
                     f"learned a smaller vocabulary")
    except RuntimeError as e:
        if not _too_many_chars(e):
            raise _training_error(e, vocab_size, character_coverage) from None
        # The vocabulary has no room for all the characters --character-coverage keeps (Chinese with a
        # small --vocab-size). Keep the most frequent characters that fit; the trainer never sees the
        # others (they become cut points), so they are written with byte pieces: still lossless.
        from tdiff import log

        opts["pretokenization_delimiter"] = DELIMITER
        budget = vocab_size - n_meta - 1  # the space piece is always there
        keep = int(CHAR_SHARE * budget)
        while True:
            reduced, share = _drop_rare_chars(sentences, keep)
            try:
                model_bytes = _run_trainer(reduced, opts, seed)
                break
            except RuntimeError as e2:
                # Too few pieces to learn from what is left: every further character kept is one more.
                m = re.search(r"Please set it to a value <= (\d+)", str(e2))
                if not m or keep >= budget:
                    raise _training_error(e2, vocab_size, character_coverage) from None
                keep = min(budget, keep + vocab_size - int(m.group(1)) + 8)
        log.warn(f"--vocab-size {vocab_size} has room for only {keep} characters: the rarer ones "
                 f"({share:.2%} of the training text) are written as byte pieces (3-4 ids each)")
        meta["max_chars"] = keep
    tok = Tokenizer.from_bytes(model_bytes, meta)
    if model_path is not None:
        tok.save(model_path)
    return tok


def _run_trainer(sentences: list[str], opts: dict, seed: int) -> bytes:
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)
    buf = io.BytesIO()  # in memory: no temp path ends up in the model's trainer_spec
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=buf, **opts)
    return buf.getvalue()


def _too_many_chars(e: RuntimeError) -> bool:
    return "Vocabulary size is smaller than required_chars" in str(e)


def _drop_rare_chars(sentences: list[str], keep: int) -> tuple[list[str], float]:
    """SENTENCES with all but the KEEP most frequent characters turned into DELIMITER; (them, share dropped)."""
    from collections import Counter

    counts: Counter = Counter()
    for t in sentences:
        counts.update(t)
    counts.pop(DELIMITER, None)
    total = sum(counts.values()) or 1
    kept = {" "} | {c for c, _ in counts.most_common(keep)}
    rare = {ord(c): DELIMITER for c in counts if c not in kept}
    dropped = sum(n for c, n in counts.items() if c not in kept)
    out = [t.translate(rare) for t in sentences]
    return [t for t in out if t.strip(DELIMITER)], dropped / total


def _training_error(e: RuntimeError, vocab_size: int, coverage: float) -> TdiffError:
    msg = str(e)
    m = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", msg)
    if m:
        need = int(m.group(2))
        return UsageError(
            f"--vocab-size {vocab_size} is too small for this text: byte fallback plus the characters that "
            f"--character-coverage {coverage} keeps need {need} pieces; use --vocab-size {need + 100} or more, "
            f"or a lower --character-coverage (down to {MIN_COVERAGE})"
        )
    m = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", msg)
    if m:
        return UsageError(
            f"--vocab-size {vocab_size} is too large for this little text (at most {m.group(2)} pieces can be "
            f"learned); use a smaller --vocab-size or give more text"
        )
    return TdiffError(f"SentencePiece training failed: {_first_line(e)}")
