"""What the benchmarks share: where the repository and the corpora are, the tdiff CLI run as a timed
subprocess, JSON on stdout and progress on stderr, thread count and load average, the judge model,
and parameter counts. Heavy imports (torch, tdiff's models) happen inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SHARED", ROOT.parent / "shared"))


def corpus_dir() -> Path:
    """The folder of the corpora (songci.txt, tangshi.txt, ...): $SHARED itself when it holds them,
    else $SHARED/data (SHARED defaults to ../shared relative to the repository root)."""
    return SHARED if (SHARED / "songci.txt").exists() else SHARED / "data"


def logger(name: str):
    """A function printing `NAME: message` progress lines on stderr."""
    def log(msg: str) -> None:
        print(f"{name}: {msg}", file=sys.stderr, flush=True)

    return log


def print_json(obj, indent: int | None = None) -> None:
    """OBJ as one JSON document on stdout (non-ASCII text kept as it is)."""
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded: benchmarks report them since the machine may be shared."""
    return [round(x, 2) for x in os.getloadavg()]


def set_threads(n: int) -> int:
    """torch.set_num_threads(N) unless N is 0 (torch's default kept); the thread count in use."""
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def children_cpu_s() -> float:
    """User + system CPU seconds of every waited-for child process so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_tdiff(args: list, stdout=subprocess.DEVNULL) -> tuple[float, float, str]:
    """Run `python -m tdiff ARGS` from the repository root: (wall seconds, CPU seconds of the command
    and its workers, stderr). Exits with the command and the end of its stderr when it fails."""
    args = [str(a) for a in args]
    c0, t0 = children_cpu_s(), time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "tdiff", *args], stdout=stdout, stderr=subprocess.PIPE,
                       cwd=ROOT, check=False)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - c0
    err = r.stderr.decode("utf-8", "replace")
    if r.returncode != 0:
        raise SystemExit(f"tdiff {' '.join(args)} failed ({r.returncode}): {err[-800:]}")
    return wall, cpu, err


def read_texts(path) -> list[str]:
    """The "text" field of every record of a JSONL file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


class Judge:
    """A `tdiff train-ar` model that scores texts by its perplexity (per judge token), re-tokenizing
    them with its own tokenizer."""

    def __init__(self, path, dtype: str = "fp32", batch_size: int = 64, device: str = "cpu"):
        from tdiff.formats.ar_dir import load_ar

        self.model, self.tok = load_ar(path, device)
        self.dtype, self.batch_size = dtype, batch_size

    def ppl(self, texts: list[str]) -> float:
        from tdiff.evaluation.metrics import ppl
        from tdiff.evaluation.perplexity import judge_nll

        nll, n = judge_nll(self.model, self.tok, texts, batch_size=self.batch_size, dtype=self.dtype)
        return ppl(nll, n)


def n_params(module) -> int:
    """Parameter count of a torch module."""
    return sum(p.numel() for p in module.parameters())


def tdiff_params(bundle) -> dict:
    """Parameter counts of a tdiff bundle: VAE, its decoder, DiT, the whole model (VAE + DiT) and the
    sampling path (DiT + VAE decoder: the encoder is unused when sampling)."""
    vae, dit = bundle.vae, bundle.dit
    dec = sum(n_params(m) for m in (vae.from_latent, vae.dec_blocks, vae.dec_norm, vae.lm_head,
                                    *(getattr(vae, n) for n in ("ctx_emb", "ctx_blocks", "ctx_norm") if hasattr(vae, n))))
    return {"vae": n_params(vae), "vae_decoder": dec, "dit": n_params(dit),
            "total": n_params(vae) + n_params(dit), "sampling_path": n_params(dit) + dec}


def gpt2_params(vocab: int, n_pos: int, n_layer: int, n_embd: int) -> int:
    """Parameters of GPT2LMHeadModel (tied lm_head): wte + wpe + blocks + final LayerNorm."""
    block = 12 * n_embd ** 2 + 13 * n_embd          # c_attn 3d²+3d, c_proj d²+d, mlp 8d²+5d, 2 LayerNorms 4d
    return vocab * n_embd + n_pos * n_embd + n_layer * block + 2 * n_embd
