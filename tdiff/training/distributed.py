"""Data-parallel training across processes: PyTorch's `torchrun` launcher and DistributedDataParallel.

    torchrun --nproc_per_node 2 -m tdiff train -i ids.jsonl --vae vae.safetensors -o model.safetensors ...

torchrun starts one process per rank and sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous
address; `setup` joins the process group (gloo on CPU, NCCL on CUDA, each rank on its own GPU
cuda:LOCAL_RANK). Without torchrun (WORLD_SIZE unset or 1) nothing here does anything and a run is
the single-process run.

What makes a W-process run the same run as one process (tdiff/training/loop.py):
- An optimizer step is --grad-accum micro-batches of --batch-size examples (the global batch); the
  processes take equal shares of them, so W changes who computes a micro-batch, never what is
  computed. Where W does not divide --grad-accum, `share_out` first cuts each micro-batch into
  smaller ones (64 × 1 on 2 processes: 32 × 2, the same examples per step).
- Micro-batch n of the run draws its data and noise from streams seeded by (seed, n) alone, on every
  rank alike, so it is the same micro-batch whichever rank computes it.
- Gradients are averaged by DDP's all-reduce (after the last local micro-batch; `no_sync` before),
  each local loss scaled by W / grad_accum, which gives the single process's mean exactly (up to
  the order of float additions). Metrics are summed across ranks the same way.
- Every stop is agreed: the time budget, a signal and a skipped (non-finite) step are decided by an
  all-reduce each step, so no rank waits in a collective that another has left.
- Rank 0 alone writes checkpoints, the metrics log, the final artifact and progress lines.
"""

from __future__ import annotations

import os


def world_size() -> int:
    """Processes in this run (1 without torchrun)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


def is_main() -> bool:
    """True in the process that writes files and logs (rank 0, or the only process)."""
    return rank() == 0


def share_out(batch_size: int, grad_accum: int, world: int) -> tuple[int, int]:
    """(batch_size, grad_accum) of the same global batch whose micro-batches WORLD processes can share
    equally. When WORLD divides GRAD_ACCUM nothing changes; else each micro-batch is cut into F
    smaller ones (F = WORLD / gcd(GRAD_ACCUM, WORLD)), e.g. the defaults --batch-size 64 --grad-accum 1
    on 2 processes become 32 × 2: the same examples per optimizer step, and exactly the run that one
    process makes with those two options. UsageError when --batch-size cannot be cut in F."""
    import math

    if grad_accum % world == 0:
        return batch_size, grad_accum
    f = world // math.gcd(grad_accum, world)
    if batch_size % f:
        from tdiff.core.errors import UsageError

        raise UsageError(f"--batch-size {batch_size} × --grad-accum {grad_accum} cannot be shared out between "
                         f"{world} processes: give a --grad-accum that is a multiple of {world}, or a "
                         f"--batch-size divisible by {f}")
    return batch_size // f, grad_accum * f


def env_is_main() -> bool:
    """is_main() from the launcher's environment alone (RANK), without importing torch: for the
    command layer's start-up, which must stay fast for commands that never load torch."""
    try:
        return int(os.environ.get("RANK", "0")) == 0 or not launched()
    except ValueError:
        return True


def launched() -> bool:
    """Whether torchrun (or another launcher setting WORLD_SIZE > 1) started this process."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def setup(device: str) -> str:
    """Join the process group when launched by torchrun; the device this rank trains on.

    DEVICE is the --device value: with CUDA each rank takes cuda:LOCAL_RANK; on CPU all ranks use
    the CPU (gloo). A no-op returning DEVICE in a single process."""
    if not launched():
        return device
    import datetime

    import torch
    import torch.distributed as dist

    from tdiff.core.errors import UsageError

    local = int(os.environ.get("LOCAL_RANK", "0"))
    name = (device or "auto").lower()
    cuda = name.startswith("cuda") or (name == "auto" and torch.cuda.is_available())
    if cuda:
        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")
        torch.cuda.set_device(local)
        name = f"cuda:{local}"
    elif name == "auto":
        name = "cpu"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=10))
    return name


def teardown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(values, op: str = "sum", device="cpu"):
    """VALUES (a list of floats) reduced over the ranks by OP (sum | max | min); a list of floats.
    One collective for the whole list. Identity in a single process."""
    if world_size() == 1:
        return list(values)
    import torch
    import torch.distributed as dist

    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op])
    return t.tolist()


def all_gather(t):
    """Tensor T (same shape on every rank) of every rank, concatenated along dim 0 in rank order.
    T itself in a single process."""
    if world_size() == 1:
        return t
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)
