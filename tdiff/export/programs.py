"""Deployable artifacts of a trained model (`tdiff export`).

Four formats, each verified against the source model before it is reported as written:

- ``safetensors``: the slim model file. The EMA weights only (the raw training weights are
  dropped), the networks' weights cast to the chosen dtype; still self-contained (tokenizer,
  config, schedule, time warp, sampler defaults), and `tdiff sample` takes it like any model
  (weights are widened back to fp32 on load; sampling then runs in any --dtype).
- ``export``: three `torch.export` programs — one denoiser call, the VAE decoder and the noise
  schedule — plus the tokenizer and a config.json. The solver stays in plain Python (it is a few
  lines: examples/sample_exported.py runs them with nothing but torch and sentencepiece).
- ``torchscript``: the same three programs traced to TorchScript, for runtimes that load those.
- ``onnx``: the same three programs as ONNX graphs (opset of torch.onnx's dynamo exporter), for
  the optional extra `pip install tdiff[onnx]`; verified with onnxruntime.

The programs' signatures are fixed, every conditioning input a tensor (the batch size B is
dynamic; N latent positions, C channels, L tokens and V pieces are the model's):

    denoiser(x_t f32 (B, N, C), t f64 (B,), self_cond f32 (B, N, C), label i64 (B,),
             cond_x f32 (B, N, C), cond_mask f32 (B, N, 1)) -> x0 estimate f32 (B, N, C)
    decoder(z f32 (B, N, C)) -> logits f32 (B, L, V)          z in the denoiser's (normalized) space
    schedule(t f64 (K,)) -> alpha_sigma f64 (2, K)

Inputs a model does not use are ignored: `label` without labels (-1 is the null label), the
span inputs without a span channel, `self_cond` without self-conditioning (zeros before the
first step otherwise). Weights inside the programs are in the export dtype; inputs and outputs
are always fp32 (f64 for times), so a caller never deals with half precision.

Verification (`verify_*`): the exported artifact and the source model in fp32 on one fixed
input (seeded noise, times spread over (0, 1), random labels and known spans); the figure is the
largest absolute difference divided by the largest absolute reference value, and it must not
exceed TOLERANCE[dtype].
"""

from __future__ import annotations

import copy
from pathlib import Path

from tdiff.files import artifacts
from tdiff.formats.export_dir import MARKER, check_target, save_export
from tdiff.core.choices import EXPORT_FORMATS
from tdiff.core.errors import OutputError, UsageError

FORMATS = {"safetensors": "slim model.safetensors", "export": "torch.export programs (.pt2)",
           "torchscript": "TorchScript programs (.pt)", "onnx": "ONNX graphs (.onnx)"}
assert tuple(FORMATS) == EXPORT_FORMATS
# max |exported − source| / max |source| on the verification input; fp32 is rounding only, the
# half types are the weights' rounding through a few layers (measured: docs/RESULTS.md, "Export").
TOLERANCE = {"fp32": 1e-4, "fp16": 5e-3, "bf16": 2e-2}
PROGRAMS = ("denoiser", "decoder", "schedule")
SUFFIX = {"export": ".pt2", "torchscript": ".pt", "onnx": ".onnx"}
VERIFY_BATCHES = (3, 1)     # the fixed inputs: the batch dimension is dynamic, so two sizes are checked


# ---------------------------------------------------------------- program modules


def _modules():
    import torch
    import torch.nn as nn

    from tdiff.diffusion.process import pred_to_x0
    from tdiff.diffusion.spans import merge

    class DenoiserStep(nn.Module):
        """One denoiser call: Bundle.x0_estimate with every input a tensor (see the module docstring)."""

        def __init__(self, bundle):
            super().__init__()
            self.dit, self.schedule = bundle.dit, bundle.schedule
            self.target = bundle.diffusion["target"]
            c = bundle.dit.config
            self.use_sc, self.use_label, self.use_spans = c.self_condition, c.num_labels > 0, c.cond_channels

        def forward(self, x_t, t, self_cond, label, cond_x, cond_mask):
            spans = (cond_x, cond_mask) if self.use_spans else (None, None)
            x = merge(x_t, *spans)                                                # (B, N, C)
            alpha, sigma = self.schedule.alpha_sigma(t)                           # (B,) f64 each
            pred = self.dit(x, t.to(x.dtype), self_cond=self_cond if self.use_sc else None,
                            label=label if self.use_label else None,
                            cond_x=spans[0], cond_mask=spans[1])                  # (B, N, C)
            x0 = pred_to_x0(self.target, pred.to(x.dtype), x, alpha.to(x.dtype), sigma.to(x.dtype))
            return merge(x0, *spans)                                              # (B, N, C)

    class DecoderStep(nn.Module):
        """Normalized latents (B, N, C) → float32 logits (B, L, V) through the VAE decoder."""

        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, z):
            return self.vae.decode(self.vae.denormalize(z)).float()              # (B, L, V)

    class ScheduleStep(nn.Module):
        """Times (K,) float64 → (α, σ) stacked, (2, K) float64."""

        def __init__(self, schedule):
            super().__init__()
            self.schedule = schedule

        def forward(self, t):
            a, s = self.schedule.alpha_sigma(t)
            return torch.stack([a, s])                                            # (2, K)

    return DenoiserStep, DecoderStep, ScheduleStep


def cast_bundle(bundle, dtype: str):
    """A deep copy of BUNDLE with the DiT's and the VAE's weights in DTYPE (the latent statistics,
    the schedule and the time warp stay float32: they are a handful of numbers)."""
    from tdiff.core.device import torch_dtype

    out = copy.copy(bundle)
    out.dit = copy.deepcopy(bundle.dit).to(torch_dtype(dtype))
    vae = copy.deepcopy(bundle.vae)
    stats = vae.latent_mean.clone(), vae.latent_std.clone()
    vae.to(torch_dtype(dtype))
    vae.latent_mean, vae.latent_std = stats
    out.vae = vae
    return out


def program_modules(bundle, dtype: str) -> dict:
    """{name: nn.Module in eval mode} of the three programs, weights in DTYPE."""
    Denoiser, Decoder, Schedule = _modules()
    b = cast_bundle(bundle, dtype)
    return {"denoiser": Denoiser(b).eval(), "decoder": Decoder(b.vae).eval(), "schedule": Schedule(b.schedule).eval()}


def example_inputs(bundle, batch: int = VERIFY_BATCHES[0], seed: int = 0) -> dict:
    """{program: tuple of inputs}: the fixed verification input (also the tracing example)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    n, c = bundle.latent_shape
    nl = bundle.dit.config.num_labels
    x = torch.randn(batch, n, c, generator=g)                                    # (B, N, C)
    t = torch.linspace(0.9, 0.1, batch, dtype=torch.float64)                     # (B,)
    sc = torch.randn(batch, n, c, generator=g)
    label = torch.randint(-1, max(nl, 0) + (1 if nl else 0), (batch,), generator=g) if nl else \
        torch.full((batch,), -1, dtype=torch.long)
    cx = torch.randn(batch, n, c, generator=g)
    cm = (torch.rand(batch, n, 1, generator=g) < 0.3).float()
    cm[0] = 0.0                                                                   # one row with nothing known
    return {"denoiser": (x, t, sc, label, cx, cm), "decoder": (torch.randn(batch, n, c, generator=g),),
            "schedule": (torch.linspace(1.0, 0.0, 13, dtype=torch.float64)[:-1],)}


def _relative_error(got, ref) -> float:
    import torch

    got, ref = got.double(), ref.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12))


def verification_inputs(bundle) -> list[dict]:
    """The fixed inputs every export is checked on, one per size in VERIFY_BATCHES."""
    return [example_inputs(bundle, b, seed=i) for i, b in enumerate(VERIFY_BATCHES)]


def reference_outputs(bundle, inputs: list[dict]) -> list[dict]:
    """The fp32 source model's outputs on each of INPUTS (eager, through the same program modules)."""
    import torch

    mods = program_modules(bundle, "fp32")
    with torch.inference_mode():
        return [{k: mods[k](*inp[k]) for k in PROGRAMS} for inp in inputs]


def check_outputs(run, inputs: list[dict], refs: list[dict], dtype: str, what: str, files: dict) -> dict:
    """{program: {"file", "rel_error", "tolerance"}}: RUN(name, args) against REFS on every input; the
    worst relative error of each program must be within TOLERANCE (else OutputError)."""
    import torch

    report = {}
    for name in PROGRAMS:
        with torch.inference_mode():
            err = max(_relative_error(run(name, inp[name]), ref[name]) for inp, ref in zip(inputs, refs))
        tol = TOLERANCE["fp32"] if name == "schedule" else TOLERANCE[dtype]
        report[name] = {"file": files[name], "rel_error": err, "tolerance": tol}
        if not err <= tol:
            raise OutputError(f"export: the {what} {name} differs from the source model by {err:.3g} "
                              f"(relative; tolerance {tol:g} for {dtype}); nothing written")
    return report


# ---------------------------------------------------------------- the formats


def _dynamic_batch():
    from torch.export import Dim

    return Dim("batch", min=1, max=1 << 16)


def _save_export(mod, inputs, path, name):
    import torch
    from torch.export import Dim

    if name == "schedule":
        shapes = ({0: Dim("k", min=1, max=1 << 16)},)
    else:
        b = _dynamic_batch()
        shapes = tuple({0: b} for _ in inputs)
    ep = torch.export.export(mod, inputs, dynamic_shapes=shapes, strict=False)
    torch.export.save(ep, str(path))


def _load_export(path):
    import torch

    return torch.export.load(str(path)).module()


def _save_torchscript(mod, inputs, path, name):
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.inference_mode(False), torch.no_grad():
            traced = torch.jit.trace(mod, inputs, check_trace=False)
    torch.jit.save(traced, str(path))


def _load_torchscript(path):
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)       # torch 2.13 steers towards torch.export
        return torch.jit.load(str(path))


def _save_onnx(mod, inputs, path, name):
    import logging
    import warnings

    import torch

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)         # its start-up chatter about torchvision
    warnings.filterwarnings("ignore", category=FutureWarning)

    names = {"denoiser": ["x_t", "t", "self_cond", "label", "cond_x", "cond_mask"], "decoder": ["z"],
             "schedule": ["t"]}[name]
    torch.onnx.export(mod, inputs, str(path), input_names=names, dynamo=True,
                      dynamic_shapes={n: {0: torch.export.Dim.DYNAMIC} for n in names},
                      external_data=False, verbose=False)


class _OnnxProgram:
    def __init__(self, path):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def __call__(self, *args):
        import torch

        feed = {n: a.numpy() for n, a in zip(self.names, args)}
        return torch.from_numpy(self.session.run(None, feed)[0])


def onnx_problem() -> str | None:
    """Why the onnx format cannot be written here, or None."""
    import importlib.util

    missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
    if missing:
        return f"needs {', '.join(missing)}: install the optional extra (pip install 'tdiff[onnx]')"
    return None


SAVERS = {"export": (_save_export, _load_export), "torchscript": (_save_torchscript, _load_torchscript),
          "onnx": (_save_onnx, _OnnxProgram)}


def write_programs(bundle, out_dir: Path, fmt: str, dtype: str, inputs: list[dict], refs: list[dict]) -> dict:
    """Save the three programs in FMT to OUT_DIR (traced on the first of INPUTS), reload each and
    check it on every input against REFS (`check_outputs`)."""
    save, load = SAVERS[fmt]
    mods = program_modules(bundle, dtype)
    progs, files = {}, {}
    for name in PROGRAMS:
        path = out_dir / f"{name}{SUFFIX[fmt]}"
        save(mods[name], inputs[0][name], path, name)
        progs[name], files[name] = load(path), path.name
    return check_outputs(lambda name, args: progs[name](*args), inputs, refs, dtype, fmt, files)


def slim_tensors(art, dtype: str, use_ema: bool = True) -> dict:
    """The tensors of a slim model file: VAE, the EMA denoiser stored as `dit` (USE_EMA False: the raw
    training weights), schedule and time warp; floating-point network weights in DTYPE (latent
    statistics kept in float32)."""
    from tdiff.core.device import torch_dtype

    dt = torch_dtype(dtype)
    ema = use_ema and any(k.startswith("dit_ema.") for k in art.tensors)
    out = {}
    for k, v in art.tensors.items():
        if (k.startswith("dit.") and ema) or (k.startswith("dit_ema.") and not ema):
            continue                                     # the weights not kept: dropped
        if k.startswith("dit_ema."):
            k = "dit." + k[len("dit_ema."):]
        network = k.startswith(("dit.", "vae.")) and not k.endswith(("latent_mean", "latent_std"))
        out[k] = v.to(dt) if network and v.is_floating_point() else v
    return out


def write_slim(art, path: Path, dtype: str, source_sha: str, use_ema: bool = True) -> None:
    """Write the slim model file of artifact ART (see `slim_tensors`) to PATH."""
    from tdiff.formats.model import load_tokenizer, model_parts_from, save_model

    config = dict(art.config)
    config["export"] = {"format": "safetensors", "dtype": dtype, "ema": use_ema,
                        "source": {"file": Path(art.path).name, "sha256": source_sha}}
    save_model(path, art.kind, model_parts_from(slim_tensors(art, dtype, use_ema)), config, art.train,
               load_tokenizer(art))


def verify_slim(path: Path, dtype: str, inputs: list[dict], refs: list[dict]) -> dict:
    """Load the slim file as `tdiff sample` does and check its outputs against REFS (`check_outputs`)."""
    from tdiff.formats.model import load_model

    mods = program_modules(load_model(path, "cpu"), "fp32")
    return check_outputs(lambda name, args: mods[name](*args), inputs, refs, dtype, "slim model's",
                         {k: path.name for k in PROGRAMS})


# ---------------------------------------------------------------- the directory


def program_config(bundle, art, fmt: str, dtype: str, source_sha: str, ema: bool = True) -> dict:
    """config.json of a program directory: what a standalone sampler needs to know (EMA: whether the
    programs hold the EMA denoiser)."""
    from tdiff.sampling.sample import sampling_plan

    tok = bundle.tokenizer
    steps, solver, _ = sampling_plan(bundle, None, None)
    n, c = bundle.latent_shape
    return {MARKER: 1, "format": fmt, "dtype": dtype,
            "programs": {k: f"{k}{SUFFIX[fmt]}" for k in PROGRAMS}, "tokenizer": "tokenizer.model",
            "latent_len": n, "latent_dim": c, "max_len": bundle.vae.config.max_len,
            "vocab_size": bundle.vae.config.vocab_size,
            "pad_id": tok.pad_id, "bos_id": tok.bos_id, "eos_id": tok.eos_id, "unk_id": tok.unk_id,
            "end_run": 3, "self_condition": bool(bundle.diffusion.get("self_condition", True)),
            "labels": bundle.labels, "known_spans": bundle.known_spans,
            "steps": steps, "solver": solver, "kind": art.kind, "ema": ema,
            "tokenizer_meta": art.tokenizer_meta,
            "source": {"file": Path(art.path).name, "sha256": source_sha}}


def export_model(model_path, out: Path, fmt: str, dtype: str, use_ema: bool = True) -> dict:
    """Export MODEL_PATH to directory OUT in FMT with weights in DTYPE (the EMA denoiser, or with USE_EMA
    False the raw training weights); verify; return the report.

    The directory is assembled beside OUT (a symlink's target) and moved into place only after every
    check passed, so a failure (or an interrupt) leaves OUT as it was; temp folders of earlier runs
    killed on the way are removed. Only an empty directory or an unchanged earlier export is replaced
    (`check_target`)."""
    import torch

    from tdiff.formats.model import MODEL_KINDS, load_model
    from tdiff.files.streams import file_sha256

    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if dtype not in TOLERANCE:
        raise UsageError(f"--dtype {dtype!r}: choose one of {', '.join(TOLERANCE)}")
    if fmt == "onnx" and onnx_problem():
        raise UsageError(f"--format onnx: {onnx_problem()}")
    out = Path(out)
    check_target(out)                                      # before any work; checked again on the way in
    art = artifacts.load_artifact(model_path, expect=MODEL_KINDS)
    bundle = load_model(model_path, "cpu", use_ema=use_ema)
    if fmt != "safetensors" and bundle.vae.config.decoder == "contextual":
        raise UsageError(f"--format {fmt}: this model's VAE has the contextual decoder (token-by-token decoding), "
                         "which the programs do not hold; use --format safetensors")
    if fmt != "safetensors" and bundle.dit.config.block_causal:
        raise UsageError(f"--format {fmt}: a block-causal model (train --block-size) is sampled block by block "
                         "with a key/value cache, which the programs do not hold; use --format safetensors")
    sha = file_sha256(model_path)
    inputs = verification_inputs(bundle)
    refs = reference_outputs(bundle, inputs)

    def write(tmp: Path) -> dict:
        nonlocal checks
        if fmt == "safetensors":
            path = tmp / "model.safetensors"
            write_slim(art, path, dtype, sha, use_ema)
            checks = verify_slim(path, dtype, inputs, refs)
            config = {MARKER: 1, "format": fmt, "dtype": dtype, "model": path.name,
                      "source": {"file": Path(art.path).name, "sha256": sha}}
        else:
            with torch.inference_mode(False):
                checks = write_programs(bundle, tmp, fmt, dtype, inputs, refs)
            (tmp / "tokenizer.model").write_bytes(art.tokenizer)
            config = program_config(bundle, art, fmt, dtype, sha, use_ema)
        config["verify"] = {"input": f"seeded, batches {list(VERIFY_BATCHES)}",
                            "measure": "max|export - source| / max|source|, worst over the inputs",
                            "checks": checks}
        return config

    checks = {}
    target = save_export(out, write)
    sizes = {p.name: p.stat().st_size for p in sorted(target.iterdir())}
    return {"format": fmt, "dtype": dtype, "dir": str(out), "files": sizes, "checks": checks,
            "source_bytes": Path(model_path).stat().st_size}
