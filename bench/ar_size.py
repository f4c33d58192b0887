"""Print `n_layer n_embd n_head` of a GPT-2 with a tdiff model's parameter count (VAE + DiT, what
sampling runs), within ±10%, preferring at least 4 layers: the AR baseline of the same size.

Usage: python bench/ar_size.py model.safetensors
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from tdiff.models.ar import build_model, make_config
    from tdiff.formats.model import load_bundle

    b = load_bundle(sys.argv[1])
    target = sum(p.numel() for p in b.vae.parameters()) + sum(p.numel() for p in b.dit.parameters())
    V, P = b.tokenizer.vocab_size, b.vae.config.max_len + 2

    def gpt2_params(nl, ne):  # tied embeddings: wte + wpe + blocks (12 E^2 + 13 E each) + final norm
        return V * ne + P * ne + nl * (12 * ne * ne + 13 * ne) + 2 * ne

    cands = [(abs(gpt2_params(nl, ne) / target - 1), nl, ne) for nl in range(2, 9) for ne in range(64, 769, 32)]
    deep = [c for c in cands if c[1] >= 4]
    err, nl, ne = min(deep) if min(deep)[0] <= 0.1 else min(cands)
    n = sum(p.numel() for p in build_model(make_config(V, P, n_layer=nl, n_embd=ne, n_head=4)).parameters())
    if abs(n / target - 1) > 0.1:
        sys.exit(f"ar_size: no GPT-2 within 10% of {target:,} parameters (closest {n:,})")
    print(nl, ne, 4)


if __name__ == "__main__":
    main()
