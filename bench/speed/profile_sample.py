"""Where generation time goes, tdiff vs AR, with torch.profiler; prints one JSON object on stdout.

The same models and timed paths as bench.speed.speed_vs_ar (random weights of `--preset`, 128
tokens, a GPT-2 of the same parameter count), one profiled run per (method, batch) after a
warm-up. Operator self-times are grouped into:

- matmul: aten::mm / addmm / bmm / linear / matmul (the work FLOPs count),
- attention: the scaled-dot-product kernels,
- norm: layer_norm / rms_norm and their pieces,
- softmax_sampling: softmax, topk, argmax, sort, multinomial (decoding and the VAE head),
- elementwise: everything else that is an aten op (adds, muls, copies, cat, index, ...),
- outside_ops: wall time minus the sum of all op self-times: Python, dispatch, framework
  bookkeeping (for AR `generate`: its per-token logits processing, cache updates, stopping
  criteria; for tdiff: the solver's float64 coefficient arithmetic and the loop).

The same tdiff run is also split by component ("components"), with timing wrappers instead of the
profiler (exclusive times: a component's own time, its sub-components' taken out):

- dit: the denoiser network (DiT forward; a block model's forward_cached and extend_cache) but its
  attention; dit_attention: the DiT's attention (projections, rotary, SDPA, output projection),
- denoiser_glue: the x0 estimate around the network (known-span merge, v → x0),
- vae_decoder: the VAE decoder's blocks but their attention; vae_attention: theirs,
- head: the V-way output layer and its greedy argmax (`greedy_head`),
- end_check: a block model's end-of-text reading (`ended_rows`, its decoder and head included),
- solver_and_loop: the rest of the wall time: noise, the solver's update arithmetic, Python.

Usage: python -m bench.speed.profile_sample [--steps 12] [--batch 1,64] [--dtype fp32] [--preset tiny]
       [--model model.safetensors]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bench.common import print_json, tdiff_params
from bench.speed import speed_vs_ar as S

GROUPS = [
    ("attention", ("scaled_dot_product", "flash_attention")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "aten::baddbmm")),
    ("norm", ("layer_norm", "rms_norm", "aten::rsqrt", "aten::pow", "aten::mean", "aten::var")),
    ("softmax_sampling", ("softmax", "topk", "argmax", "aten::sort", "multinomial", "aten::max")),
]


def group_of(name: str) -> str:
    for g, keys in GROUPS:
        if any(k in name for k in keys):
            return g
    return "elementwise"


def profile(fn) -> dict:
    """Wall time of one call of FN and the self CPU time of its aten ops, grouped."""
    from torch.profiler import ProfilerActivity, profile as tprofile

    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    groups: dict[str, float] = {}
    top = []
    for ev in prof.key_averages():
        if not ev.key.startswith("aten::"):
            continue
        self_s = ev.self_cpu_time_total / 1e6
        g = group_of(ev.key)
        groups[g] = groups.get(g, 0.0) + self_s
        top.append((self_s, ev.key, ev.count))
    in_ops = sum(groups.values())
    groups["outside_ops"] = max(0.0, wall - in_ops)
    top.sort(reverse=True)
    return {"wall_s": round(wall, 4),
            "share": {k: round(v / wall, 3) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "aten_calls": sum(c for _, _, c in top),
            "top_ops": [{"op": k, "self_s": round(s, 4), "calls": c} for s, k, c in top[:6]]}


COMPONENTS = [  # (owner, attribute, key): the wrapped callables of `components`
    ("tdiff.models.dit:DiT", "forward", "dit"), ("tdiff.models.dit:DiT", "forward_cached", "dit"),
    ("tdiff.models.dit:DiT", "extend_cache", "dit"), ("tdiff.models.layers:Attention", "attend", "attention"),
    ("tdiff.formats.model:Bundle", "x0_estimate", "denoiser_glue"),
    ("tdiff.models.vae:TextVAE", "decode_hidden", "vae_decoder"),
    ("tdiff.sampling.sample", "greedy_head", "head"), ("tdiff.sampling.sample", "ended_rows", "end_check"),
]


def components(fn) -> dict:
    """Wall time of one call of FN split into COMPONENTS' exclusive times (attention counted as
    dit_attention inside the DiT, vae_attention elsewhere); the remainder is solver_and_loop."""
    import importlib
    from collections import defaultdict

    spent: dict[str, float] = defaultdict(float)
    stack: list[list] = []                                 # [key, time of children]
    saved = []

    def wrap(owner, name, key):
        orig = getattr(owner, name)

        def timed(*a, **k):
            if key == "attention":
                k_ = "dit_attention" if any(f[0] == "dit" for f in stack) else "vae_attention"
            else:
                k_ = key
            stack.append([k_, 0.0])
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                _, child = stack.pop()
                spent[k_] += dt - child
                if stack:
                    stack[-1][1] += dt
        setattr(owner, name, timed)
        saved.append((owner, name, orig))

    for where, name, key in COMPONENTS:
        mod, _, cls = where.partition(":")
        owner = importlib.import_module(mod)
        wrap(getattr(owner, cls) if cls else owner, name, key)
    try:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    finally:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)
    spent["solver_and_loop"] = max(0.0, wall - sum(spent.values()))
    return {"wall_s": round(wall, 4), "seconds": {k: round(v, 4) for k, v in spent.items()},
            "share": {k: round(v / wall, 3) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=S.int_list, default=[1, 64])
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--model", default="", help="a trained model.safetensors instead of random weights")
    a = p.parse_args()
    sargs = S.parse_args(["--preset", a.preset, "--steps", str(a.steps)] + (["--model", a.model] if a.model else []))

    import torch

    torch.set_num_threads(a.threads)
    device = torch.device("cpu")
    bundle, _ = S.build_tdiff(sargs, device)
    L, V = bundle.vae.config.max_len, bundle.vae.config.vocab_size
    model, count, info = S.build_ar(tdiff_params(bundle)["total"], V, L, bundle.tokenizer, sargs, device)
    runner = S.Runner(bundle, model, L, device)
    out = {"seq_len": L, "dtype": a.dtype, "threads": a.threads, "steps": a.steps,
           "ar_config": {k: info[k] for k in ("n_layer", "n_embd", "n_head")}, "runs": []}
    for batch in a.batch:
        runner.ar(batch, a.dtype)                  # warm-up at full length: the KV cache's memory is touched
        runner.tdiff(batch, a.dtype, a.steps)
        for name, fn in (("ar", lambda: runner.ar(batch, a.dtype)),
                         (f"tdiff_dpm{a.steps}", lambda: runner.tdiff(batch, a.dtype, a.steps))):
            S.log(f"profiling {name} at batch {batch}")
            r = profile(fn)
            r.update(method=name, batch=batch, tokens_per_s_under_profiler=round(batch * L / r["wall_s"], 1))
            if name != "ar":
                r["components"] = components(fn)
            out["runs"].append(r)
    print_json(out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
