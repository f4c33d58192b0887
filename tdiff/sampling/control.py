"""Controllable generation requests: what is given, what is generated, and how the text is put back.

A request is a *template* over the model's token window (L = the VAE's max_len): token ids where
something is given, and which positions are known. Every kind of control is one template:

    --prompt TEXT             prompt tokens known, the rest free (the model chooses where the text ends)
    --length N                N unknown tokens that must be text, pads known after them
    --prompt TEXT --length N  the prompt, then exactly N generated tokens, then pads
    --infill "A[MASK:5]B"     A known, 5 unknown tokens, B known, pads known after B
    --infill "A[MASK]B"       a [MASK] without a number is --mask-len tokens; a [MASK] at the very end
                              is a free continuation (the model chooses the length, up to the window)
    --edit "A[[old]]B"        A and B known; `old` regenerated as many tokens as `old` has
    {"prompt": P}             as --prompt (records on stdin, one per line; "length" and "label" too)
    {"text": T, "mask": [[s, e], …]}   as --edit with the characters s..e-1 of T regenerated

Control syntax (`lex`): [MASK], [MASK:n] and [[…]] are the only control tokens; a backslash before a
bracket makes it literal (\\[MASK:2] is the text "[MASK:2]", \\[\\[x\\]\\] the text "[[x]]"). Text that
looks like a control token but is not one ("[MASK: 2]", "[MASK:x]", an unclosed "[[", nested spans),
or a control token where the option does not take it (a [MASK] in --prompt or --edit, a [[…]] in
--prompt or --infill), is an error that says what to write instead: a typo is never taken as text.
The text of a {"text", "mask"} record has no control syntax: its spans are character offsets.

The model side — how known tokens become known latents — is tdiff/diffusion/spans.py, shared with
training. Here: parsing, the positions that must decode to text (inside a span, or before a fixed
end), and assembling the output text (known text verbatim; pads inside spans dropped; a free tail cut
where the pads begin, as unconditional samples are).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tdiff.core.errors import DataError, UsageError

MASK_OK = re.compile(r"\[MASK(?::(\d+))?\]")
MASK_LIKE = re.compile(r"\[\s*mask(?=[\s:\]]|$)", re.I)      # what a mask token attempt starts with
BRACKETS = re.compile(r"\[+|\]+")
MAX_DIGITS = 18               # a [MASK:n] with more digits is larger than any window (and than int's string limit)
RECORD_KEYS = ("prompt", "text", "mask", "length", "label")


@dataclass
class Template:
    """One request over a window of L tokens."""

    ids: list[int]                  # (L,) given tokens; pad where nothing is given
    known: list[bool]               # (L,) given positions
    must_text: list[bool]           # (L,) unknown positions that must decode to a text token
    tail: int | None                # first position of a free continuation (None: the length is fixed)
    fields: dict = field(default_factory=dict)   # the input record's fields, passed through
    label: str | None = None

    @property
    def conditional(self) -> bool:
        return any(self.known)


# ---------------------------------------------------------------- control syntax


def lex(text: str, where: str, fail) -> list[tuple]:
    """The control tokens of TEXT, in order: ("text", literal text with the escapes resolved),
    ("mask", n or None, raw), ("open", "[["), ("close", "]]"). A string that starts like a mask
    token but does not parse, or a run of three or more brackets, is FAIL(message) naming WHERE."""
    out: list[tuple] = []
    buf: list[str] = []
    i = 0

    def flush():
        if buf:
            out.append(("text", "".join(buf)))
            buf.clear()

    while i < len(text):
        c = text[i]
        if c == "\\" and text[i + 1:i + 2] in ("[", "]"):
            buf.append(text[i + 1])
            i += 2
            continue
        if c in "[]":
            run = BRACKETS.match(text, i).end() - i
            if run >= 3:
                fail(f"{where}: '{c * run}' is ambiguous; write \\{c} for each literal bracket next to a "
                     f"{'[[' if c == '[' else ']]'} mark")
            if run == 2:
                flush()
                out.append(("open" if c == "[" else "close", c * 2))
                i += 2
                continue
            if c == "[" and MASK_LIKE.match(text, i):
                flush()
                token, i = _mask_token(text, i, where, fail)
                out.append(token)
                continue
        buf.append(c)
        i += 1
    flush()
    return out


def _mask_token(text: str, i: int, where: str, fail) -> tuple[tuple, int]:
    """(("mask", n or None, raw), the index after it) for the mask attempt starting at TEXT[I]."""
    close, reopen = text.find("]", i), text.find("[", i + 1)
    if close < 0 or 0 <= reopen < close:
        raw = _short(text[i:reopen if reopen >= 0 else len(text)].rstrip())
        fail(f"{where}: '{raw}' is not closed; write [MASK] or [MASK:n] (n tokens), or {_escaped(raw)} for the "
             "literal text")
    raw = text[i:close + 1]
    m = MASK_OK.fullmatch(raw)
    if m is None:
        compact = re.sub(r"\s+", "", raw).upper()
        hint = f"write {compact}" if MASK_OK.fullmatch(compact) else "write [MASK] or [MASK:n] with n a number of tokens"
        fail(f"{where}: '{_short(raw)}' is not a mask token; {_short(hint)}, or {_escaped(_short(raw))} for the "
             "literal text")
    digits = m.group(1)
    if digits is None:
        return ("mask", None, raw), close + 1
    n = int(digits) if len(digits.lstrip("0")) <= MAX_DIGITS else 10 ** MAX_DIGITS
    if n < 1:
        fail(f"{where}: '{_short(raw)}': a span has at least 1 token")
    return ("mask", n, _short(raw)), close + 1


def _short(raw: str, limit: int = 40) -> str:
    """RAW as quoted in a message: at most LIMIT characters."""
    return raw if len(raw) <= limit else raw[:limit - 1] + "…"


def literal(text: str, where: str, fail=None) -> str:
    """TEXT as plain text (a prompt): escapes resolved; a control token is FAIL(message), by default
    a UsageError."""
    fail = fail or _usage
    out = []
    for token in lex(text, where, fail):
        if token[0] != "text":
            raw = token[-1]
            fail(f"{where}: '{raw}' is control syntax, which a prompt does not take (--infill fills [MASK] "
                 f"spans, --edit rewrites [[…]] spans); write {_escaped(raw)} for the literal text")
        out.append(token[1])
    return "".join(out)


def _escaped(raw: str) -> str:
    """How to write control token RAW as literal text: a backslash before each opening bracket
    (before each closing one for ']]')."""
    return raw.replace("[", "\\[") if "[" in raw else raw.replace("]", "\\]")


# ---------------------------------------------------------------- templates


def _build(pieces, tok, window: int, where: str, fail) -> Template:
    """Template from PIECES: ("text", str) known text, ("span", n) n unknown text tokens,
    ("tail", None) a free continuation (last piece only). Without a tail the pads after the
    last piece are known (the length is fixed). FAIL(message) raises the caller's error kind.
    The size is checked before anything is allocated: a span may ask for any number of tokens."""
    pieces = [(kind, _encode(tok, value) if kind == "text" else value) for kind, value in pieces]
    need = sum(len(v) if kind == "text" else v for kind, v in pieces if kind != "tail")
    tail_given = any(kind == "tail" for kind, _ in pieces)
    if need > window or (tail_given and need >= window):
        fail(f"{where}: {need} tokens{' and a continuation' if tail_given else ''} do not fit "
             f"the model's window of {window} tokens")
    ids: list[int] = []
    known: list[bool] = []
    must: list[bool] = []
    tail = None
    for kind, value in pieces:
        if kind == "text":
            ids += value
            known += [True] * len(value)
            must += [False] * len(value)
        elif kind == "span":
            ids += [tok.pad_id] * value
            known += [False] * value
            must += [True] * value
        else:
            tail = len(ids)
    rest = window - len(ids)
    ids += [tok.pad_id] * rest
    known += [tail is None] * rest                     # fixed length: the pads are given
    must += [False] * rest
    if tail == 0:                                      # nothing given: a text is at least one token
        must[0] = True
    return Template(ids=ids, known=known, must_text=must, tail=tail)


def _encode(tok, text: str) -> list[int]:
    return tok.encode(text) if text else []


def parse_infill(text: str, mask_len: int, window: int) -> list[tuple[str, object]]:
    """Pieces of an --infill string: text between [MASK] / [MASK:n] marks (module docstring)."""
    fail = _usage
    tokens = lex(text, "--infill", fail)
    marks = [i for i, t in enumerate(tokens) if t[0] == "mask"]
    if not marks:
        raise UsageError("--infill: no [MASK] or [MASK:n] in the text (use --prompt to continue a text)")
    pieces: list[tuple[str, object]] = []
    for i, token in enumerate(tokens):
        kind = token[0]
        if kind == "text":
            pieces.append(("text", token[1]))
        elif kind in ("open", "close"):
            fail(f"--infill: '{token[1]}' marks an --edit span; --infill fills [MASK] and [MASK:n] "
                 f"(write {_escaped(token[1])} for literal brackets)")
        elif token[1] is None and i == len(tokens) - 1:
            pieces.append(("tail", None))
        elif token[1] is None:
            if mask_len > window:
                fail(f"--mask-len {mask_len}: a [MASK] of {mask_len} tokens does not fit the model's window "
                     f"of {window} tokens")
            pieces.append(("span", mask_len))
        else:
            if token[1] > window:
                fail(f"--infill: '{token[2]}' does not fit the model's window of {window} tokens")
            pieces.append(("span", token[1]))
    return pieces


def parse_edit(text: str) -> list[tuple[str, str]]:
    """An --edit string as ("text", kept) and ("old", to regenerate) parts of literal text, in order."""
    fail = _usage
    parts: list[tuple[str, str]] = []
    inside = None                                          # the span being read, or None
    for token in lex(text, "--edit", fail):
        kind = token[0]
        if kind == "mask":
            fail(f"--edit: '{token[2]}' is an --infill mask; --edit rewrites [[…]] spans "
                 f"(write {_escaped(token[2])} for the literal text)")
        elif kind == "open":
            if inside is not None:
                fail("--edit: '[[' inside a [[…]] span: spans do not nest (write \\[ for a literal bracket)")
            inside = ""
        elif kind == "close":
            if inside is None:
                fail("--edit: ']]' without a '[[' before it (write \\] for a literal bracket)")
            if not inside:
                fail("--edit: '[[]]' marks nothing to regenerate; put the text to rewrite inside, or insert "
                     "new text with --infill \"…[MASK:n]…\"")
            parts.append(("old", inside))
            inside = None
        elif inside is not None:
            inside += token[1]
        else:
            parts.append(("text", token[1]))
    if inside is not None:
        fail("--edit: '[[' is not closed by ']]' (write \\[ for a literal bracket)")
    if not any(kind == "old" for kind, _ in parts):
        fail("--edit: mark the spans to regenerate with [[…]], e.g. 床前[[明月]]光")
    return parts


def _edit_spans(parts, tok) -> list[tuple[str, object]]:
    """Template pieces of --edit PARTS: each old text becomes a span of as many tokens as it holds."""
    return [("text", v) if kind == "text" else ("span", max(1, len(tok.encode(v)))) for kind, v in parts]


def _usage(msg: str):
    raise UsageError(msg)


def _edit_pieces(text: str, marks, tok) -> list[tuple[str, object]]:
    pieces: list[tuple[str, object]] = []
    pos = 0
    for start, end, old in marks:
        pieces.append(("text", text[pos:start]))
        pieces.append(("span", max(1, len(tok.encode(old)))))
        pos = end
    pieces.append(("text", text[pos:]))
    return pieces


def from_options(tok, window: int, *, prompt: str | None, infill: str | None, edit: str | None,
                 length: int, mask_len: int, label: str | None) -> Template:
    """The template of the command-line options (one request, repeated --num times)."""
    given = [name for name, v in (("--prompt", prompt), ("--infill", infill), ("--edit", edit)) if v is not None]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)}: give one of --prompt, --infill, --edit")
    if infill is not None or edit is not None:
        if length:
            raise UsageError(f"--length: {given[0]} fixes the length already (one token per [MASK:n] or [[…]] token)")
        if infill is not None:
            t = _build(parse_infill(infill, mask_len, window), tok, window, "--infill", _usage)
            t.fields = {"infill": infill}
        else:
            parts = parse_edit(edit)
            t = _build(_edit_spans(parts, tok), tok, window, "--edit", _usage)
            t.fields = _edit_fields(parts)
    else:
        if length > window:
            raise UsageError(f"--length {length}: more than the model's window of {window} tokens")
        text = literal(prompt, "--prompt") if prompt else ""
        where = "--prompt" if text and not length else ("--length" if not text else f"--prompt with --length {length}")
        t = _build(_prompt_pieces(text, length), tok, window, where, _usage)
        if prompt:
            t.fields = {"prompt": text}
    t.label = label
    return t


def _edit_fields(parts) -> dict:
    """{"source", "mask"} of an --edit string's PARTS (`parse_edit`): the text without the [[ ]]
    marks, and the marked spans as [start, end] character offsets into it (what `tdiff eval`
    checks the output against)."""
    source, mask = "", []
    for kind, value in parts:
        if kind == "old":
            mask.append([len(source), len(source) + len(value)])
        source += value
    return {"source": source, "mask": mask}


def _prompt_pieces(prompt: str, length: int) -> list[tuple[str, object]]:
    pieces: list[tuple[str, object]] = [("text", prompt)] if prompt else []
    return pieces + ([("span", length)] if length else [("tail", None)])


def from_record(rec: dict, tok, window: int, name: str, line: int, mask_len: int) -> Template:
    """The template of one input record: {"prompt": P} or {"text": T, "mask": [[s, e], …]}, with
    optional "length" and "label"; a DataError naming NAME:LINE when it is neither, or when it asks
    for more than the WINDOW."""
    where = f"{name}:{line}"

    def fail(msg):
        raise DataError(msg)

    length = rec.get("length", 0)
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        fail(f"{where}: 'length' must be a non-negative integer")
    if length > window:
        fail(f"{where}: 'length' {length} is more than the model's window of {window} tokens")
    label = rec.get("label")
    if label is not None:
        label = str(label)
    if "mask" in rec:
        text, mask = rec.get("text"), rec["mask"]
        if not isinstance(text, str):
            fail(f"{where}: a record with 'mask' needs a 'text' string")
        if length:
            fail(f"{where}: 'length' with 'mask': the mask fixes the length already")
        marks = []
        prev = 0
        if not isinstance(mask, list) or not mask:
            fail(f"{where}: 'mask' must be a non-empty list of [start, end] character offsets")
        for span in mask:
            ok = (isinstance(span, list) and len(span) == 2
                  and all(isinstance(v, int) and not isinstance(v, bool) for v in span))
            if not ok or not prev <= span[0] < span[1] <= len(text):
                fail(f"{where}: 'mask' span {span!r}: need [start, end] with 0 ≤ start < end ≤ {len(text)}, "
                     "in order and not overlapping")
            marks.append((span[0], span[1], text[span[0]:span[1]]))
            prev = span[1]
        t = _build(_edit_pieces(text, marks, tok), tok, window, where, fail)
        t.fields = {"source": text}
    elif "prompt" in rec:
        if not isinstance(rec["prompt"], str):
            fail(f"{where}: 'prompt' must be a string")
        text = literal(rec["prompt"], f"{where}: 'prompt'", fail)
        t = _build(_prompt_pieces(text, length), tok, window, where, fail)
        t.fields = {"prompt": text}
    else:
        fail(f"{where}: a record needs 'prompt', or 'text' with 'mask' (see `man tdiff-sample`)")
    t.fields = {**{k: v for k, v in rec.items() if k not in ("text",)}, **t.fields}
    t.label = label
    return t
def unconditional(window: int) -> Template:
    """The template of a plain sample: nothing known, a free text of at least one token."""
    return Template(ids=[0] * window, known=[False] * window, must_text=[True] + [False] * (window - 1), tail=0)


def continuation(prefix: list[int], window: int, pad_id: int) -> Template:
    """A long text's next segment: the token ids PREFIX known, then the rest of the window generated
    as text (a segment of `sample --segments` fills its window)."""
    n = len(prefix)
    if not 0 < n < window:
        raise ValueError(f"a continuation needs 1 to {window - 1} known tokens, got {n}")
    rest = window - n
    return Template(ids=list(prefix) + [pad_id] * rest, known=[True] * n + [False] * rest,
                    must_text=[False] * n + [True] * rest, tail=None)


def assemble(row: list[int], t: Template, tok, trim) -> list[int]:
    """The text's token ids from a decoded ROW (L,) whose known positions hold the given tokens:
    given and generated tokens in order without pads or special ids, a free tail cut by TRIM
    (tdiff.sampling.sample.trim_ids) where its pads begin."""
    specials = {tok.pad_id, tok.bos_id, tok.eos_id}
    end = len(row) if t.tail is None else t.tail
    out = [int(i) for i in row[:end] if i not in specials]
    if t.tail is not None:
        out += trim(row[t.tail:], tok)
    return out
