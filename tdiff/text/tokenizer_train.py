"""SentencePiece training: `train` learns a lossless model for `Tokenizer` from texts.

`train` builds models with identity normalization, byte fallback, no dummy
prefix and no whitespace folding, so `decode(encode(text)) == text` for any
text (see `tdiff.text.tokenizer`). With pretokenize="jieba" the trainer sees
jieba words joined by the delimiter of `tdiff.text.pretokenize`, which its
`pretokenization_delimiter` removes again, so no piece spans two words.

Small vocabularies. SentencePiece refuses a vocabulary with fewer free slots
than the characters --character-coverage keeps (0.98 at the lowest), which
rules out e.g. 600 pieces for Chinese. `train` then keeps only the most
frequent characters that fit and turns the others into cut points of the
training text; at encode time they fall back to byte pieces, so nothing is lost.
"""

from __future__ import annotations

import io
import random
import re
from typing import Iterable, Iterator, Sequence

from tdiff.core.errors import DataError, TdiffError, UsageError
from tdiff.text.pretokenize import DELIMITER, segment_for_training
from tdiff.text.tokenizer import BOS_ID, EOS_ID, FORMAT, PAD_ID, PRETOKENIZERS, SPACE_MARK, UNK_ID, Tokenizer

MODEL_TYPES = ("unigram", "bpe")
MIN_COVERAGE = 0.98  # SentencePiece refuses a lower --character_coverage
TRAIN_CHUNK_CHARS = 8192  # longer texts are cut into pieces of this size for training only
MAX_SENTENCE_BYTES = 1 << 16
CHAR_SHARE = 0.8  # when characters overflow a small vocabulary: share of its free slots given to characters


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
        raise DataError("no text to train the tokenizer on (the input has no non-empty 'text'); give some text or an existing -t/--tokenizer model")

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
            from tdiff.core import log

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
        from tdiff.core import log

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


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__

