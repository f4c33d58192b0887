"""What a training checkpoint holds beyond the weights: optimizer state and random generators,
as tensors plus JSON (no pickle), so `--resume` continues exactly where it left off.
The file itself is an artifact of kind `checkpoint` (tdiff/files/artifacts.py).
"""

from __future__ import annotations


def optimizer_to_tensors(opt) -> tuple[dict, dict]:
    """Split an optimizer state_dict into tensors (for safetensors) and a JSON-able rest."""
    import torch

    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for name, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{idx}.{name}"] = v
            else:
                scalars[f"{idx}.{name}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def optimizer_from_tensors(opt, tensors: dict, info: dict) -> None:
    state: dict = {}
    for k, v in tensors.items():
        if not k.startswith("optim."):
            continue
        _, idx, name = k.split(".", 2)
        state.setdefault(int(idx), {})[name] = v
    for k, v in info.get("scalars", {}).items():
        idx, name = k.split(".", 1)
        state.setdefault(int(idx), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": info["param_groups"]})
