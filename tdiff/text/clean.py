"""Text cleaning for `tdiff clean`: normalize, split, filter, de-duplicate.

The pipeline for one input text (a line, a paragraph or a JSONL field):

1. ``normalize_text``: delete zero-width and control characters, Unicode NFC,
   collapse whitespace, optionally convert punctuation (``--punct``).
2. ``chunk_text``: split into sentences and pack whole sentences into chunks of
   at most ``max_chars`` characters (only when a limit is set).
3. ``Cleaner``: drops empty and short texts, exact duplicates (an 8-byte
   BLAKE2b digest per kept text is the only state that grows), and keeps
   counts in ``CleanStats``.

Everything here is plain ``re``/``unicodedata``/``str.translate`` work on one
text at a time, so cleaning streams in constant memory.

Design choices (documented in man/tdiff-clean.1):

- Deleted: C0 controls except tab and newline (and the whitespace controls
  VT, FF, CR, which become spaces), DEL, C1 controls except NEL (a space),
  U+200B–U+200F, U+2060 (word joiner) and U+FEFF.
- Whitespace: every Unicode space (tab, NBSP, U+2000–U+200A, U+3000
  ideographic space, U+2028/U+2029, …) counts as a space; runs become one
  ASCII space; each line is stripped; blank lines inside a text are dropped,
  single newlines are kept.
- ``punct="full"``: , . ; : ? ! ( ) become ，。；：？！（） when the nearest
  non-space character on either side is CJK (Han, kana, Hangul, CJK or
  full-width punctuation); ASCII digits next to the mark are looked through
  (共100. → 共100。). Spaces around a converted mark are removed; "..." becomes
  "……". Parentheses convert in pairs. With ``protect`` (default) a mark with an
  ASCII letter or digit directly on both sides (3.14, 1,000, 10:30, U.S.A,
  www.x.com, f(x)) or ending a dotted abbreviation (U.S.A.) is never touched.
- ``punct="half"``: ，。；：？！（） become , . ; : ? ! ( ) everywhere; no
  spaces are inserted.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import asdict, dataclass
from typing import Iterable, Iterator

PUNCT_MODES = ("keep", "full", "half")

# --- character classes -------------------------------------------------------

# Controls that are deleted outright. Tab, newline and the whitespace controls
# (VT, FF, CR, NEL) are left for the whitespace pass, which turns them into spaces.
_DELETED = (
    "\x00-\x08\x0e-\x1f\x7f"  # C0 (minus \t \n \v \f \r) and DEL
    "\x80-\x84\x86-\x9f"  # C1 minus NEL (\x85)
    "\u200b-\u200f\u2060\ufeff"  # zero-width space/joiners, LRM/RLM, word joiner, BOM
)
_DELETE_RE = re.compile(f"[{_DELETED}]+")

# Any whitespace except newline: a run of two or more, or a single one that is not a space.
_WS_RUN_RE = re.compile(r"[^\S\n]{2,}|[^\S \n]")
_NEWLINE_RE = re.compile(r" ?\n\s*")

_CJK = (
    "\u2e80-\u2fdf"  # CJK radicals
    "\u3000-\u303f"  # CJK symbols and punctuation
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3100-\u312f\u3130-\u318f\u31a0-\u31ff"  # bopomofo, Hangul jamo, extensions
    "\u3200-\u4dbf"  # enclosed CJK, compatibility, extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\ua960-\ua97f\uac00-\ud7af"  # Hangul
    "\uf900-\ufaff"  # compatibility ideographs
    "\ufe30-\ufe4f"  # CJK compatibility forms
    "\uff00-\uffef"  # full-width and half-width forms
    "\U00020000-\U0003ffff"  # extensions B and later
)
_CJK_RE = re.compile(f"[{_CJK}]")

_ASCII_ALNUM = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_DIGITS = frozenset("0123456789")

# --- punctuation ---------------------------------------------------------------

_TO_FULL = {",": "，", ".": "。", ";": "；", ":": "：", "?": "？", "!": "！", "(": "（", ")": "）"}
_TO_HALF = str.maketrans({v: k for k, v in _TO_FULL.items()})
_HALF_ANY_RE = re.compile(r"[,.;:?!()]")
_FULL_ANY_RE = re.compile("[" + "".join(_TO_FULL.values()) + "]")

# A run of marks with at most one space either side (whitespace is already collapsed).
_MARK_RUN_RE = re.compile(r" ?([,.;:?!]+) ?")
# A parenthesized span without nested or line-crossing parentheses, or a lone parenthesis.
_PAREN_RE = re.compile(r" ?(?:\(([^()\n]*)\)|([()])) ?")
# A dotted abbreviation ending right before a final dot: "U.S.A" in "U.S.A.".
_ABBREV_TAIL_RE = re.compile(r"(?<![A-Za-z0-9])(?:[A-Za-z]\.)+[A-Za-z]\Z")

# --- sentences -------------------------------------------------------------------

_CLOSERS = "”’」』）)\\]】》〉\"'"
# Chinese ends are ends wherever they stand; an English . ! ? ends a sentence only
# when followed by whitespace and a non-lowercase character, by a CJK character,
# or by the end of the text (so 3.14, e.g. this, www.x.com do not split).
_SENT_END_RE = re.compile(
    f"(?:[。！？；…]+|[.!?]+(?=[{_CLOSERS}]*(?:\\s+[^\\sa-z]|\\s*\\Z|[{_CJK}])))[{_CLOSERS}]*"
)
# Where a too-long sentence may be cut: after a comma-like mark, or at whitespace.
_COMMA_RE = re.compile(r"[，、：,:]")
_SPACE_RE = re.compile(r"\s")
# Marks that should not begin a piece of a hard-cut sentence.
_NO_LINE_START = frozenset("，。、；：？！…）」』”’》〉】,.;:?!)]")


def _is_cjk(ch: str) -> bool:
    return bool(ch) and _CJK_RE.match(ch) is not None


# --- normalization ---------------------------------------------------------------


def remove_controls(s: str) -> str:
    """Delete zero-width characters, BOMs and C0/C1 controls (tab, newline and
    the whitespace controls VT/FF/CR/NEL are kept for ``collapse_whitespace``)."""
    return _DELETE_RE.sub("", s)


def collapse_whitespace(s: str) -> str:
    """Runs of spaces, tabs and other Unicode spaces (U+3000 included) become one
    ASCII space; lines are stripped; blank lines vanish; single newlines stay."""
    s = _WS_RUN_RE.sub(" ", s)
    if "\n" in s:
        s = _NEWLINE_RE.sub("\n", s)
    return s.strip()


def _left_context(s: str, i: int) -> str:
    """The character that decides the context left of index I: skip one space,
    then a run of ASCII digits ('' at the start of the text)."""
    j = i - 1
    if j >= 0 and s[j] == " ":
        j -= 1
    while j >= 0 and s[j] in _DIGITS:
        j -= 1
    return s[j] if j >= 0 else ""


def _right_context(s: str, i: int) -> str:
    """Like ``_left_context`` for the text starting at index I."""
    n = len(s)
    j = i
    if j < n and s[j] == " ":
        j += 1
    while j < n and s[j] in _DIGITS:
        j += 1
    return s[j] if j < n else ""


def _inside_run(s: str, start: int, end: int) -> bool:
    """True when s[start:end] has an ASCII letter or digit directly on both sides."""
    return start > 0 and end < len(s) and s[start - 1] in _ASCII_ALNUM and s[end] in _ASCII_ALNUM


def _full_marks(s: str, protect: bool) -> str:
    """Convert runs of , . ; : ? ! in Chinese context (see module docstring)."""

    def repl(m: re.Match) -> str:
        a, b = m.span(1)
        run = m.group(1)
        if protect and (
            _inside_run(s, a, b) or (run == "." and _ABBREV_TAIL_RE.search(s, max(0, a - 64), a))
        ):
            return m.group(0)
        if not (_is_cjk(_left_context(s, a)) or _is_cjk(_right_context(s, b))):
            return m.group(0)
        if len(run) >= 3 and run == "." * len(run):
            return "……"
        return "".join(_TO_FULL[c] for c in run)

    return _MARK_RUN_RE.sub(repl, s)


def _full_parens(s: str, protect: bool) -> str:
    """Convert ( ) in Chinese context; a matched pair converts together."""

    def repl(m: re.Match) -> str:
        inner = m.group(1)
        if inner is None:  # a lone parenthesis
            a, b = m.span(2)
            if protect and _inside_run(s, a, b):
                return m.group(0)
            if _is_cjk(_left_context(s, a)) or _is_cjk(_right_context(s, b)):
                return _TO_FULL[m.group(2)]
            return m.group(0)
        a, b = m.start(1) - 1, m.end(1) + 1  # the "(" and one past the ")"
        if protect and (_inside_run(s, a, a + 1) or _inside_run(s, b - 1, b)):
            return m.group(0)
        left, right = _left_context(s, a), _right_context(s, b)
        if _is_cjk(left) or _is_cjk(right) or (
            _CJK_RE.search(inner) and left not in _ASCII_ALNUM and right not in _ASCII_ALNUM
        ):
            return "（" + inner.strip() + "）"
        return m.group(0)

    return _PAREN_RE.sub(repl, s)


def to_full_punct(s: str, protect: bool = True) -> str:
    """Half-width , . ; : ? ! ( ) → ，。；：？！（） where they stand in Chinese context."""
    if not _HALF_ANY_RE.search(s) or not _CJK_RE.search(s):
        return s
    if "(" in s or ")" in s:
        s = _full_parens(s, protect)
    return _full_marks(s, protect)


def to_half_punct(s: str) -> str:
    """Full-width ，。；：？！（） → , . ; : ? ! ( ) everywhere (no spaces are added)."""
    if not _FULL_ANY_RE.search(s):
        return s
    return s.translate(_TO_HALF)


def normalize_text(s: str, punct: str = "keep", protect: bool = True) -> str:
    """The cleaned form of S: controls removed, NFC, whitespace collapsed, and
    punctuation converted per PUNCT ('keep', 'full' or 'half')."""
    s = unicodedata.normalize("NFC", remove_controls(s))
    s = collapse_whitespace(s)
    if punct == "full":
        s = to_full_punct(s, protect)
    elif punct == "half":
        s = to_half_punct(s)
    elif punct != "keep":
        raise ValueError(f"punct must be one of {PUNCT_MODES}, not {punct!r}")
    return s


# --- sentences and chunks ----------------------------------------------------------


def _strip_span(s: str, a: int, b: int) -> tuple[int, int]:
    """Shrink [a, b) so that s[a:b] has no leading or trailing whitespace."""
    while a < b and s[a].isspace():
        a += 1
    while b > a and s[b - 1].isspace():
        b -= 1
    return a, b


def sentence_spans(s: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of S, whitespace excluded, in order."""
    spans = []
    start = 0
    for m in _SENT_END_RE.finditer(s):
        a, b = _strip_span(s, start, m.end())
        if a < b:
            spans.append((a, b))
        start = m.end()
    a, b = _strip_span(s, start, len(s))
    if a < b:
        spans.append((a, b))
    return spans


def split_sentences(s: str) -> list[str]:
    """The sentences of S: Chinese ends 。！？；… and English . ! ? (before a space
    and a non-lowercase letter, a CJK character or the end), each with any
    closing quotes or brackets that follow it."""
    return [s[a:b] for a, b in sentence_spans(s)]


def _break_point(s: str, a: int, limit: int) -> int:
    """Where to end a piece of a too-long sentence starting at A, at most LIMIT
    (exclusive end): after the last comma or at the last space in the window,
    whichever comes later; else LIMIT, moved back one character when the next
    piece would start with punctuation (so a mark stays with its word)."""
    best = a
    for m in _COMMA_RE.finditer(s, a + 1, limit):
        best = m.end()
    for m in _SPACE_RE.finditer(s, max(best, a + 1), limit + 1):
        best = m.start()
    if best > a:
        return best
    if limit < len(s) and s[limit] in _NO_LINE_START and limit - 1 > a:
        return limit - 1
    return limit


def _cut_sentence(s: str, a: int, b: int, max_chars: int) -> list[tuple[int, int]]:
    """Cut the sentence s[a:b] (longer than MAX_CHARS) into spans of at most MAX_CHARS."""
    out = []
    while b - a > max_chars:
        p = _break_point(s, a, a + max_chars)
        pa, pb = _strip_span(s, a, p)
        if pa < pb:
            out.append((pa, pb))
        a, _ = _strip_span(s, p, b)
    if a < b:
        out.append((a, b))
    return out


def chunk_text(s: str, max_chars: int) -> list[str]:
    """S as chunks of at most MAX_CHARS characters (0: no limit) made of whole
    sentences packed greedily; a sentence longer than the limit alone is cut at
    a comma or space where possible, else exactly at the limit. Text between
    sentences inside a chunk is kept as it was."""
    if not s:
        return []
    if max_chars <= 0 or len(s) <= max_chars:
        return [s]
    units: list[tuple[int, int]] = []
    for a, b in sentence_spans(s):
        if b - a <= max_chars:
            units.append((a, b))
        else:
            units.extend(_cut_sentence(s, a, b, max_chars))
    chunks = []
    start, end = units[0]
    for a, b in units[1:]:
        if b - start <= max_chars:
            end = b
        else:
            chunks.append(s[start:end])
            start, end = a, b
    chunks.append(s[start:end])
    return chunks


# --- the record pipeline --------------------------------------------------------------


@dataclass
class CleanStats:
    """Counts kept while cleaning; ``chars_*`` count characters, not bytes."""

    records_in: int = 0
    records_out: int = 0
    chars_in: int = 0
    chars_out: int = 0
    empty: int = 0  # inputs that were empty after cleaning
    short: int = 0  # texts dropped by min_chars
    duplicates: int = 0  # texts dropped by dedup
    split: int = 0  # inputs cut into two or more chunks

    def as_dict(self) -> dict:
        return asdict(self)


class Cleaner:
    """Maps input texts (or records) to cleaned output texts (or records).

    >>> c = Cleaner(punct="full", dedup=True)
    >>> c.clean("你好,世界 ")
    ['你好，世界']
    >>> c.clean("你好，世界"), c.stats.duplicates
    ([], 1)
    """

    def __init__(
        self,
        punct: str = "keep",
        protect: bool = True,
        max_chars: int = 0,
        min_chars: int = 0,
        dedup: bool = False,
    ):
        if punct not in PUNCT_MODES:
            raise ValueError(f"punct must be one of {PUNCT_MODES}, not {punct!r}")
        if max_chars < 0 or min_chars < 0:
            raise ValueError("max_chars and min_chars must be >= 0")
        self.punct = punct
        self.protect = protect
        self.max_chars = max_chars
        self.min_chars = min_chars
        self._seen: set[bytes] | None = set() if dedup else None
        self.stats = CleanStats()

    def _is_duplicate(self, text: str) -> bool:
        """True when TEXT was kept before; remembers it otherwise (8 bytes per text)."""
        h = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
        if h in self._seen:
            return True
        self._seen.add(h)
        return False

    def clean(self, text: str) -> list[str]:
        """The cleaned output texts for one input text (zero, one or several)."""
        st = self.stats
        st.records_in += 1
        st.chars_in += len(text)
        t = normalize_text(text, self.punct, self.protect)
        if not t:
            st.empty += 1
            return []
        pieces = chunk_text(t, self.max_chars) if self.max_chars and len(t) > self.max_chars else [t]
        if len(pieces) > 1:
            st.split += 1
        out = []
        for p in pieces:
            if len(p) < self.min_chars:
                st.short += 1
            elif self._seen is not None and self._is_duplicate(p):
                st.duplicates += 1
            else:
                out.append(p)
                st.chars_out += len(p)
        st.records_out += len(out)
        return out

    def records(self, records: Iterable[dict], field: str = "text") -> Iterator[dict]:
        """Clean FIELD of each record; every output record keeps the other fields
        (a record cut into chunks yields one record per chunk)."""
        for rec in records:
            for piece in self.clean(rec[field]):
                out = dict(rec)
                out[field] = piece
                yield out
