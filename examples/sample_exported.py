#!/usr/bin/env python3
"""Sample text from a `tdiff export` directory with nothing but torch and sentencepiece.

    tdiff export -m model.safetensors -o exported --format export      # or torchscript, onnx
    python examples/sample_exported.py exported -n 4 --seed 0           # JSONL on stdout

It does not import tdiff: the exported programs (one denoiser call, the VAE decoder, the noise
schedule) are the model, and this file is the rest — a solver, greedy decoding and the
tokenizer's byte table — in plain Python. Unconditional samples; the programs also take labels
and known spans (see config.json and `tdiff export`'s man page), left out here for brevity.

Solvers (the model's own, from config.json, unless --solver is given), on a uniform time grid:
  dpm          DPM-Solver++(2M), Lu et al. 2022, Algorithm 2 (data prediction, multistep)
  ddim         DDIM with η = 0, Song et al. 2021, eq. 12 (progressive-distillation students)
  consistency  multistep consistency sampling, Song et al. 2023, Algorithm 1 (consistency students)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import sentencepiece as spm
import torch


def load(directory):
    """(config dict, {name: callable program}, SentencePieceProcessor) of an export directory."""
    d = Path(directory)
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    fmt = cfg["format"]
    if fmt == "safetensors":
        sys.exit("sample_exported: a slim safetensors export: use `tdiff sample -m DIR/model.safetensors`")
    progs = {}
    for name, file in cfg["programs"].items():
        path = str(d / file)
        if fmt == "export":
            progs[name] = torch.export.load(path).module()
        elif fmt == "torchscript":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                progs[name] = torch.jit.load(path)
        else:                                                       # onnx
            import onnxruntime as ort

            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            names = [i.name for i in sess.get_inputs()]
            progs[name] = (lambda s, n: lambda *a: torch.from_numpy(
                s.run(None, {k: v.numpy() for k, v in zip(n, a)})[0]))(sess, names)
    sp = spm.SentencePieceProcessor(model_proto=(d / cfg["tokenizer"]).read_bytes())
    return cfg, progs, sp


def coefficients(progs, ts):
    """α, σ and the half log-SNR λ = log(α/σ) at the times TS (Python floats); t = 0 is the data."""
    a, s = progs["schedule"](torch.tensor(ts, dtype=torch.float64)).tolist()
    lam = []
    for i, t in enumerate(ts):
        if t == 0.0:
            a[i], s[i] = 1.0, 0.0
        lam.append(math.inf if s[i] == 0.0 else math.log(a[i] / s[i]))
    return a, s, lam


def solve(cfg, progs, x, steps, solver, generator=None):
    """Latents (B, N, C) at t = 0 from noise X at t = 1, in STEPS network calls."""
    b = x.shape[0]
    ts = [1.0 - i / steps for i in range(steps)] + [0.0]
    a, s, lam = coefficients(progs, ts)
    zeros = torch.zeros_like(x)
    label = torch.full((b,), -1, dtype=torch.long)                  # the null label
    mask = torch.zeros(b, x.shape[1], 1)                             # nothing known
    prev = zeros

    def denoise(xt, t):
        nonlocal prev
        x0 = progs["denoiser"](xt, torch.full((b,), t, dtype=torch.float64),
                               prev if cfg["self_condition"] else zeros, label, zeros, mask)
        prev = x0
        return x0

    x0 = x0_prev = h_prev = None
    for i in range(steps):
        if solver == "consistency" and i > 0:                        # re-noise the last estimate to t_i
            x = a[i] * x0 + s[i] * torch.randn(x.shape, generator=generator)
        x0 = denoise(x, ts[i])
        j = i + 1
        if solver == "consistency":
            continue
        if s[j] == 0.0:                                              # the last step lands on x̂0
            return x0
        if solver == "ddim":
            eps = (x - a[i] * x0) / s[i]
            x = a[j] * x0 + s[j] * eps
            continue
        h = lam[j] - lam[i]
        d = x0 if x0_prev is None else (1 + 0.5 * h / h_prev) * x0 - (0.5 * h / h_prev) * x0_prev
        x = (s[j] / s[i]) * x - (a[j] * math.expm1(-h)) * d
        x0_prev, h_prev = x0, h
    return x0


def decode_ids(cfg, progs, z):
    """Greedy token ids (B, L) of latents Z; the first position may not be pad, bos or eos."""
    logits = progs["decoder"](z)                                     # (B, L, V)
    for i in (cfg["pad_id"], cfg["bos_id"], cfg["eos_id"]):
        if i is not None and i >= 0:
            logits[:, 0, i] = float("-inf")
    return logits.argmax(-1)


def trim(cfg, row):
    """The text's ids: up to the first run of end_run pads, without pads, bos and eos."""
    out, pads = [], 0
    for i in row:
        if i == cfg["pad_id"]:
            pads += 1
            if pads >= cfg["end_run"]:
                break
            continue
        pads = 0
        if i not in (cfg["bos_id"], cfg["eos_id"]):
            out.append(i)
    return out


def byte_table(sp):
    """The UTF-8 bytes of each piece: control/unknown pieces none, byte pieces their byte."""
    table = []
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            table.append(b"")
        elif sp.is_byte(i):
            table.append(bytes([int(sp.id_to_piece(i)[3:5], 16)]))
        else:
            table.append(sp.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
    return table


def main(argv=None):
    p = argparse.ArgumentParser(description="Sample from a `tdiff export` directory (torch + sentencepiece only).")
    p.add_argument("directory")
    p.add_argument("-n", "--num", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=0, help="default: the model's own (config.json)")
    p.add_argument("--solver", choices=("dpm", "ddim", "consistency"), default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.num < 1 or args.batch_size < 1 or args.steps < 0:
        p.error("--num and --batch-size must be >= 1, --steps >= 0")
    cfg, progs, sp = load(args.directory)
    steps, solver = args.steps or cfg["steps"], args.solver or cfg["solver"]
    table = byte_table(sp)
    g = torch.Generator().manual_seed(args.seed)
    done = 0
    with torch.inference_mode():
        while done < args.num:
            b = min(args.batch_size, args.num - done)
            noise = torch.randn(b, cfg["latent_len"], cfg["latent_dim"], generator=g)
            ids = decode_ids(cfg, progs, solve(cfg, progs, noise, steps, solver, g)).tolist()
            for k, row in enumerate(ids):
                kept = trim(cfg, row)
                text = b"".join(table[i] for i in kept).decode("utf-8", errors="ignore")
                print(json.dumps({"text": text, "ids": kept, "index": done + k, "seed": args.seed,
                                  "steps": steps, "solver": solver}, ensure_ascii=False), flush=True)
            done += b


if __name__ == "__main__":
    main()
