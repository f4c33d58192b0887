"""Token data: read ids JSONL, split held-out data, pad, batch (training and evaluation alike).

The held-out split is decided by a hash of each record's ids, so `train-vae`,
`train`, `train-ar` and `eval` agree on it whatever their seeds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tdiff.core.errors import DataError
from tdiff.core.seeds import generator
from tdiff.files.streams import display_name, iter_jsonl


@dataclass
class TokenData:
    seqs: list            # list[list[int]]
    labels: list          # list[str | None], same length (None when no label field)
    digest: str           # sha256 of the ids, for provenance in checkpoints


def read_ids(path, vocab_size: int | None = None, label_field: str | None = None) -> TokenData:
    """Read `{"ids": [...]}` records; a bad record is a DataError naming its line."""
    name = display_name(path)
    seqs, labels = [], []
    h = hashlib.sha256()
    for n, rec in iter_jsonl(path):
        ids = rec.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise DataError(f"{name}:{n}: expected an 'ids' list of integers (run `tdiff tokenize` first)")
        if vocab_size is not None and ids and (max(ids) >= vocab_size or min(ids) < 0):
            raise DataError(
                f"{name}:{n}: token id {max(ids) if max(ids) >= vocab_size else min(ids)} is outside the "
                f"vocabulary of size {vocab_size} (was this data made with another tokenizer?)"
            )
        if not ids:
            continue
        seqs.append(ids)
        labels.append(None if label_field is None else rec.get(label_field))
        h.update(str(ids).encode())
    return TokenData(seqs, labels, h.hexdigest()[:16])


def is_heldout(ids, fraction: float) -> bool:
    """Deterministic held-out membership from a hash of the ids (independent of seeds)."""
    if fraction <= 0:
        return False
    d = hashlib.blake2b(str(ids).encode(), digest_size=8).digest()
    return int.from_bytes(d, "little") / 2**64 < fraction


def split(data: TokenData, fraction: float) -> tuple[TokenData, TokenData]:
    """(train, heldout) by is_heldout."""
    tr, te = TokenData([], [], data.digest), TokenData([], [], data.digest)
    for s, lab in zip(data.seqs, data.labels):
        dst = te if is_heldout(s, fraction) else tr
        dst.seqs.append(s)
        dst.labels.append(lab)
    return tr, te


def read_split(path, vocab_size: int, fraction: float,
               label_field: str | None = None) -> tuple[TokenData, TokenData, TokenData]:
    """(all, train, held-out) token data of PATH for training; a DataError when there is nothing
    to train on (no records, or every one held out)."""
    data = read_ids(path, vocab_size=vocab_size, label_field=label_field)
    if not data.seqs:
        raise DataError(f"{display_name(path)}: no token records to train on")
    train, held = split(data, fraction)
    if not train.seqs:
        raise DataError(f"{display_name(path)}: every record fell in the held-out split; lower --holdout")
    return data, train, held


def pad_batch(seqs, max_len: int, pad_id: int):
    """(B, max_len) LongTensor: each sequence truncated to max_len, then right-padded with pad_id."""
    import torch

    out = torch.full((len(seqs), max_len), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        s = s[:max_len]
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


def text_lengths(ids, pad_id: int):
    """(B,) index of the first pad of each row of IDS (B, L), L when it has none: the text's length."""
    import torch

    is_pad = ids == pad_id                                                  # (B, L)
    full = torch.full_like(is_pad[:, 0], ids.shape[-1], dtype=torch.long)
    return torch.where(is_pad.any(-1), is_pad.long().argmax(-1), full)      # (B,)


def label_index(labels: list, field: str, name: str) -> tuple[list[str], list[int]]:
    """(the sorted distinct labels, each record's index into them) of LABELS read from FIELD;
    labels are compared as strings. A DataError when a record lacks the field or fewer than two
    labels occur (nothing to steer between)."""
    missing = sum(1 for lab in labels if lab is None)
    if missing:
        raise DataError(f"{name}: {missing:,} of {len(labels):,} records have no {field!r} field "
                        f"(--label-field {field}: every record needs a label)")
    names = sorted({str(lab) for lab in labels})
    if len(names) < 2:
        raise DataError(f"{name}: --label-field {field}: only one label ({names[0]!r}); guidance needs two or more")
    pos = {n: i for i, n in enumerate(names)}
    return names, [pos[str(lab)] for lab in labels]


class BatchIndex:
    """The training data order as random access: `order(k)` is the index batch (batch_size,) of the
    run's micro-batch K. Epoch e is a permutation seeded by (seed, e); it holds n // batch_size
    batches (the last partial batch is left out). Any process computes any micro-batch directly,
    which resuming and data-parallel training need (tdiff/training/distributed.py)."""

    def __init__(self, n: int, batch_size: int, seed: int):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.per_epoch = max(1, n // batch_size)
        self._epoch, self._perm = -1, None

    def __call__(self, k: int):
        import torch

        epoch, b = divmod(int(k), self.per_epoch)
        if epoch != self._epoch:
            self._perm = torch.randperm(self.n, generator=generator(self.seed, epoch, "data"))
            self._epoch = epoch
        return self._perm[b * self.batch_size:(b + 1) * self.batch_size]


def length_percentile(seqs, q: float) -> int:
    s = sorted(len(x) for x in seqs)
    if not s:
        return 0
    return s[min(len(s) - 1, int(q * len(s)))]
