"""Train the GPT-2 causal LM baseline and judge and write a transformers directory.

Each training sequence is [bos] + ids + [eos], cut to max_len positions and
right-padded to the longest sequence of its batch; pads are labelled −100, so
the loss is transformers' causal LM cross-entropy over the ids and the eos.
The shared Trainer does the rest (AdamW, warm-up + cosine, clipping,
accumulation, EMA, autocast, checkpoints, --resume, metrics log). The saved
weights are the EMA weights; held-out perplexity is measured with them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tdiff.data import token_ids as D
from tdiff.core import log
from tdiff.core.errors import UsageError
from tdiff.formats.ar_dir import check_ar_output, save_ar
from tdiff.training import distributed
from tdiff.training.loop import LoopConfig, Trainer


@dataclass
class ARTrainConfig:
    preset: str = "tiny"
    n_layer: int = 0               # 0: the preset's
    n_embd: int = 0
    n_head: int = 0
    dropout: float = 0.1
    max_len: int = 0               # positions incl. bos and eos; 0: 99th percentile + 2, at most 1024
    batch_size: int = 32
    holdout: float = 0.02
    loop: LoopConfig = field(default_factory=LoopConfig)


def auto_max_len(seqs, cap: int = 1024) -> int:
    """99th-percentile length + 2 (bos and eos), at most CAP."""
    return max(2, min(cap, D.length_percentile(seqs, 0.99) + 2))


def train_ar(input_path, output: Path, tokenizer_path: Path, tc: ARTrainConfig, device,
             ckpt_path: Path, log_path=None, resume=False) -> dict:
    from tdiff.formats.ar_dir import check_transformers_tokenizer
    from tdiff.models.ar import build_model, make_config
    from tdiff.evaluation.perplexity import heldout_perplexity
    from tdiff.core.device import seed_everything
    from tdiff.text.tokenizer import Tokenizer

    output = Path(output)
    check_ar_output(output)
    if tc.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    tok = Tokenizer.load(tokenizer_path, option="-t/--tokenizer")
    check_transformers_tokenizer(tok)              # a conversion that would fail after training fails now
    data, train, held = D.read_split(input_path, tok.vocab_size, tc.holdout)
    max_len = tc.max_len or auto_max_len(train.seqs)
    config = make_config(tok.vocab_size, max_len, tc.preset, tc.n_layer, tc.n_embd, tc.n_head, tc.dropout,
                         bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
    seed_everything(tc.loop.seed)
    model = build_model(config).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(f"train-ar: {len(train.seqs):,} train / {len(held.seqs):,} held-out sequences, max_len {max_len}, "
             f"{config.n_layer}×{config.n_embd} ({config.n_head} heads), {n_params / 1e6:.2f}M parameters, "
             f"device {device}")
    arch = {k: getattr(config, k) for k in ("vocab_size", "n_positions", "n_layer", "n_embd", "n_head",
                                            "bos_token_id", "eos_token_id", "pad_token_id")}
    fingerprint = {"ar": arch, "data": data.digest, "train": asdict(tc) | {"loop": None}}
    rows = [([tok.bos_id] + s + [tok.eos_id])[:max_len] for s in train.seqs]
    pad = tok.pad_id
    order = D.BatchIndex(len(rows), tc.batch_size, tc.loop.seed)

    def step_fn(step, micro):
        chunk = [rows[i] for i in order(micro)]
        ids = D.pad_batch(chunk, max(len(r) for r in chunk), pad).to(device)      # (B, L)
        mask = ids != pad                                                           # (B, L)
        labels = ids.masked_fill(~mask, -100)                                       # (B, L)
        out = model(input_ids=ids, attention_mask=mask.long(), labels=labels, use_cache=False)
        return out.loss, {}, int((labels != -100).sum())

    def evaluate():
        """--eval-every: the mean held-out loss per token (nats; its exp is the perplexity) on at most
        256 held-out sequences."""
        if not held.seqs:
            return {}
        ppl, _, _ = heldout_perplexity(model, held.seqs[:256], max_len, device, batch_size=max(tc.batch_size, 32))
        return {"heldout_loss": math.log(ppl)}

    trainer = Trainer(model, step_fn, tc.loop, device, ckpt_path=ckpt_path, log_path=log_path,
                      fingerprint=fingerprint, evaluate=evaluate)
    if resume:
        trainer.resume()
    summary = trainer.run()
    with trainer.finishing(f"writing {output}"):
        model.load_state_dict(trainer.ema_state_dict())
        model.eval()
        eval_seqs = held.seqs or train.seqs[:256]
        ppl, nll, ntok = heldout_perplexity(model, eval_seqs, max_len, device, batch_size=max(tc.batch_size, 32))
        summary["heldout"] = {"perplexity": round(ppl, 4), "nll_per_token": round(nll / max(1, ntok), 6),
                              "tokens": ntok, "sequences": len(eval_seqs), "split": "heldout" if held.seqs else "train"}
        summary["parameters"] = n_params
        if distributed.is_main():                     # rank 0 writes (torchrun)
            save_ar(output, model, tok, {**summary, "seed": tc.loop.seed, "data": data.digest, "config": asdict(tc)})
        if not held.seqs:
            log.warn("no held-out records (--holdout too small for this data): perplexity measured on training data")
        log.info(f"train-ar: held-out perplexity {ppl:.3f} ({ntok:,} tokens, {len(eval_seqs):,} sequences); wrote {output}")
    return summary
