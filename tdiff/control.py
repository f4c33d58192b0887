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

The model side — how known tokens become known latents — is tdiff/diffusion/spans.py, shared with
training. Here: parsing, the positions that must decode to text (inside a span, or before a fixed
end), and assembling the output text (known text verbatim; pads inside spans dropped; a free tail cut
where the pads begin, as unconditional samples are).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tdiff.errors import DataError, UsageError

MASK_RE = re.compile(r"\[MASK(?::(\d+))?\]")
EDIT_RE = re.compile(r"\[\[(.*?)\]\]", re.S)
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


def _build(pieces, tok, window: int, where: str, fail) -> Template:
    """Template from PIECES: ("text", str) known text, ("span", n) n unknown text tokens,
    ("tail", None) a free continuation (last piece only). Without a tail the pads after the
    last piece are known (the length is fixed). FAIL(message) raises the caller's error kind."""
    ids: list[int] = []
    known: list[bool] = []
    must: list[bool] = []
    tail = None
    for kind, value in pieces:
        if kind == "text":
            piece = tok.encode(value) if value else []
            ids += piece
            known += [True] * len(piece)
            must += [False] * len(piece)
        elif kind == "span":
            ids += [tok.pad_id] * value
            known += [False] * value
            must += [True] * value
        else:
            tail = len(ids)
    if len(ids) > window or (tail is not None and tail >= window):
        fail(f"{where}: {len(ids)} tokens{' and a continuation' if tail is not None else ''} do not fit "
             f"the model's window of {window} tokens")
    rest = window - len(ids)
    ids += [tok.pad_id] * rest
    known += [tail is None] * rest                     # fixed length: the pads are given
    must += [False] * rest
    if tail == 0:                                      # nothing given: a text is at least one token
        must[0] = True
    return Template(ids=ids, known=known, must_text=must, tail=tail)


def parse_infill(text: str, mask_len: int) -> list[tuple[str, object]]:
    """Pieces of an --infill string: text between [MASK] / [MASK:n] marks (module docstring)."""
    pieces: list[tuple[str, object]] = []
    pos = 0
    marks = list(MASK_RE.finditer(text))
    if not marks:
        raise UsageError("--infill: no [MASK] or [MASK:n] in the text (use --prompt to continue a text)")
    for i, m in enumerate(marks):
        pieces.append(("text", text[pos:m.start()]))
        n = m.group(1)
        last = i == len(marks) - 1 and m.end() == len(text)
        if n is None and last:
            pieces.append(("tail", None))
        else:
            n = mask_len if n is None else int(n)
            if n < 1:
                raise UsageError(f"--infill: {m.group(0)}: a span has at least 1 token")
            pieces.append(("span", n))
        pos = m.end()
    if pos < len(text):
        pieces.append(("text", text[pos:]))
    return pieces


def parse_edit(text: str, tok) -> list[tuple[str, object]]:
    """Pieces of an --edit string: [[…]] spans regenerated with as many tokens as they hold."""
    marks = list(EDIT_RE.finditer(text))
    if not marks:
        raise UsageError("--edit: mark the spans to regenerate with [[…]], e.g. 床前[[明月]]光")
    return _edit_pieces(text, [(m.start(), m.end(), m.group(1)) for m in marks], tok)


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

    def fail(msg):
        raise UsageError(msg)

    if infill is not None or edit is not None:
        if length:
            raise UsageError(f"--length: {given[0]} fixes the length already (one token per [MASK:n] or [[…]] token)")
        pieces = parse_infill(infill, mask_len) if infill is not None else parse_edit(edit, tok)
        t = _build(pieces, tok, window, given[0], fail)
        t.fields = {"infill": infill} if infill is not None else _edit_fields(edit)
    else:
        t = _build(_prompt_pieces(prompt or "", length), tok, window, "--prompt" if prompt else "--length", fail)
        if prompt:
            t.fields = {"prompt": prompt}
    t.label = label
    return t


def _edit_fields(edit: str) -> dict:
    """{"source", "mask"} of an --edit string: the text without the [[ ]] marks, and the marked spans
    as [start, end] character offsets into it (what `tdiff eval` checks the output against)."""
    source, mask, pos = "", [], 0
    for m in EDIT_RE.finditer(edit):
        source += edit[pos:m.start()]
        mask.append([len(source), len(source) + len(m.group(1))])
        source += m.group(1)
        pos = m.end()
    return {"source": source + edit[pos:], "mask": mask}


def _prompt_pieces(prompt: str, length: int) -> list[tuple[str, object]]:
    pieces: list[tuple[str, object]] = [("text", prompt)] if prompt else []
    return pieces + ([("span", length)] if length else [("tail", None)])


def from_record(rec: dict, tok, window: int, name: str, line: int, mask_len: int) -> Template:
    """The template of one input record: {"prompt": P} or {"text": T, "mask": [[s, e], …]}, with
    optional "length" and "label"; a DataError naming NAME:LINE when it is neither."""
    where = f"{name}:{line}"

    def fail(msg):
        raise DataError(msg)

    length = rec.get("length", 0)
    if not isinstance(length, int) or isinstance(length, bool) or length < 0:
        fail(f"{where}: 'length' must be a non-negative integer")
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
        t = _build(_prompt_pieces(rec["prompt"], length), tok, window, where, fail)
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
    (tdiff.sample.trim_ids) where its pads begin."""
    specials = {tok.pad_id, tok.bos_id, tok.eos_id}
    end = len(row) if t.tail is None else t.tail
    out = [int(i) for i in row[:end] if i not in specials]
    if t.tail is not None:
        out += trim(row[t.tail:], tok)
    return out
