"""What a denoiser trains on, shared by `train` and `distill`: the token ids of a JSONL file as
normalized VAE latents, their labels, and each step's random known spans and labels.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LatentData:
    """The training split as tensors on the training device."""

    data: object               # tdiff.data.token_ids.read_ids result (its .digest identifies the file)
    train: object              # the training split (.seqs, .labels)
    held: object               # the held-out split
    lat: object                # (M, N, D) normalized VAE posterior means of the training split
    ids: object                # (M, L) padded ids (for known spans and the decoder CE), or None
    labels: object            # (M,) label indices, or None
    label_names: list


def load_latents(input_path, vae, tok, *, holdout: float, label_field: str, device, need_ids: bool,
                 label_names: list | None = None) -> LatentData:
    """Read INPUT_PATH, split it, encode the training split. With LABEL_FIELD the labels are
    indexed (against LABEL_NAMES when given: a distilled student keeps its teacher's labels)."""
    import torch

    from tdiff.data import token_ids as D
    from tdiff.core.errors import DataError
    from tdiff.files.streams import display_name
    from tdiff.data.latents import encode_latents

    data, train, held = D.read_split(input_path, tok.vocab_size, holdout, label_field=label_field or None)
    names, labels = [], None
    if label_field:
        names, idx = D.label_index(train.labels, label_field, display_name(input_path))
        if label_names is not None:
            unknown = sorted(set(names) - set(label_names))
            if unknown:
                raise DataError(f"{display_name(input_path)}: labels {', '.join(unknown)} are not the model's "
                                f"({', '.join(label_names)})")
            idx = [label_names.index(names[i]) for i in idx]
            names = list(label_names)
        labels = torch.tensor(idx, dtype=torch.long, device=device)                        # (M,)
    vcfg = vae.config
    lat = encode_latents(vae, train.seqs, vcfg.max_len, tok.pad_id, device)                # (M, N, D)
    ids = D.pad_batch(train.seqs, vcfg.max_len, tok.pad_id).to(device) if need_ids else None   # (M, L)
    return LatentData(data=data, train=train, held=held, lat=lat, ids=ids, labels=labels, label_names=names)


def draw_conditions(ld: LatentData, idx, vae, tok, *, cond_prob: float, label_dropout: float, generator):
    """(cond_x, cond_mask, label) for the rows IDX of one step: random known spans for a
    COND_PROB share of the rows (diffusion/spans.py), and the rows' labels with a LABEL_DROPOUT
    share replaced by the null label −1 (classifier-free guidance). None where unused."""
    import torch

    from tdiff.diffusion import spans

    cond_x = cond_mask = label = None
    if cond_prob > 0:
        ids = ld.ids[idx]                                                                 # (B, L)
        known = spans.random_known(ids, tok.pad_id, cond_prob, generator)                 # (B, L)
        cond_x, cond_mask = spans.condition(vae, ids, known, tok.unk_id)                  # (B, N, D), (B, N, 1)
    if ld.labels is not None:
        label = ld.labels[idx]                                                            # (B,)
        drop = torch.rand(len(idx), generator=generator, device=label.device) < label_dropout
        label = torch.where(drop, torch.full_like(label, -1), label)                      # -1: the null label
    return cond_x, cond_mask, label
