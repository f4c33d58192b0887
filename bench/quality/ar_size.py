"""Print `n_layer n_embd n_head` of a GPT-2 with a tdiff model's parameter count (VAE + DiT, what
sampling runs), within ±10%, preferring at least 4 layers: the AR baseline of the same size.

Usage: python -m bench.quality.ar_size model.safetensors
"""

from __future__ import annotations

import argparse
import sys

from bench.common import gpt2_params, n_params, tdiff_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a tdiff model.safetensors")
    a = ap.parse_args()
    from tdiff.formats.model import load_model
    from tdiff.models.ar import build_model, make_config

    b = load_model(a.model)
    target = tdiff_params(b)["total"]
    V, P = b.tokenizer.vocab_size, b.vae.config.max_len + 2
    cands = [(abs(gpt2_params(V, P, nl, ne) / target - 1), nl, ne) for nl in range(2, 9) for ne in range(64, 769, 32)]
    deep = [c for c in cands if c[1] >= 4]
    err, nl, ne = min(deep) if min(deep)[0] <= 0.1 else min(cands)
    n = n_params(build_model(make_config(V, P, n_layer=nl, n_embd=ne, n_head=4)))
    if abs(n / target - 1) > 0.1:
        sys.exit(f"ar_size: no GPT-2 within 10% of {target:,} parameters (closest {n:,})")
    print(nl, ne, 4)


if __name__ == "__main__":
    main()
