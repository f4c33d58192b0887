"""A trained text diffusion model as one object: tokenizer + VAE + DiT + schedule.

Built from the self-contained `model.safetensors` (kind `model` or `student`)
or from a `vae.safetensors` while training the denoiser. `x0_estimate` is the
function every solver calls: it runs the network (with self-conditioning and
optional span conditioning) and turns its x0/eps/v output into an x0 estimate.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import MISSING, dataclass, field, fields

from tdiff.files import artifacts
from tdiff.core import choices
from tdiff.core.errors import DataError

MODEL_KINDS = ("model", "student")
MAX_INT = 2 ** 31 - 1      # no integer a config holds (sizes, ids, counts) is larger
_TYPE_WORDS = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string",
               dict: "a JSON object", list: "a list", None: "null"}
# The config sections `load_model` reads besides vae, dit, schedule and timewarp (whose fields come
# from their classes): {field: JSON type}, and the fields that must be present.
DIFFUSION_FIELDS = {"target": str, "self_condition": bool, "known_spans": bool, "cond_prob": float}
LABELS_FIELDS = {"field": str, "names": list}
STUDENT_FIELDS = {"method": str, "steps": int, "solver": str, "time_grid": str, "from_steps": int,
                  "rounds": list, "teacher": dict}
REQUIRED = {"diffusion": ("target",), "labels": ("names",), "student": ("method", "steps", "solver")}


# ---------------------------------------------------------------- checking what a file says


def _show(value) -> str:
    """VALUE as the file spells it, shortened."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(path, where: str, problem: str) -> DataError:
    """The error for config field WHERE of file PATH."""
    return DataError(f"{path}: config field '{where}' {problem}")


def _is(value, kind) -> bool:
    """Whether JSON VALUE is of KIND (a type, or None for null). A bool is no integer or number,
    an integer is a number, and a number is finite."""
    if kind is None or value is None:
        return value is kind
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int) or isinstance(value, float) and math.isfinite(value)
    return isinstance(value, kind)


def check_object(path, where: str, d, spec: dict, required=(), closed: bool = True) -> dict:
    """D, the JSON value at config field WHERE of file PATH, checked against SPEC {key: kind or tuple
    of kinds (see `_is`)}: an object with the REQUIRED keys, each key of SPEC of its kind and, if
    CLOSED, no other key. Returns D; a DataError names the first field at fault."""
    if not isinstance(d, dict):
        raise _bad(path, where, f"must be a JSON object, got {_show(d)}")
    for key in required:
        if key not in d:
            raise _bad(path, f"{where}.{key}", "is missing")
    for key, value in d.items():
        if key not in spec:
            if closed:
                raise _bad(path, f"{where}.{key}", f"is an unknown key (known: {', '.join(sorted(spec))})")
            continue
        kinds = spec[key] if isinstance(spec[key], tuple) else (spec[key],)
        if not any(_is(value, k) for k in kinds):
            want = " or ".join(_TYPE_WORDS[k] for k in kinds)
            raise _bad(path, f"{where}.{key}", f"must be {want}, got {_show(value)}")
        if _is(value, int) and abs(value) > MAX_INT:
            raise _bad(path, f"{where}.{key}", f"must be at most {MAX_INT:,} in size, got {_show(value)}")
    return d


def check_choice(path, where: str, value: str, known, noun: str) -> None:
    """VALUE, the name of a NOUN, is one of KNOWN."""
    if value not in known:
        raise _bad(path, where, f"names an unknown {noun} {value!r} (known: {', '.join(known)})")


def _dataclass_spec(cls) -> tuple[dict, tuple]:
    """({field: kinds}, required fields) of a config dataclass, from its annotations."""
    hints = typing.get_type_hints(cls)
    spec = {f.name: tuple(None if a is type(None) else a for a in typing.get_args(hints[f.name]))
            or hints[f.name] for f in fields(cls)}
    required = tuple(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
    return spec, required


def _options_spec(fn) -> dict:
    """{option: kind} of FN's keyword options, from their defaults (an int default: an integer)."""
    import inspect

    return {p.name: type(p.default) for p in inspect.signature(fn).parameters.values() if p.name != "self"}


def _section(path, config: dict, key: str, what: str) -> dict:
    """Config section KEY of file PATH, which must be there (a DataError naming WHAT it holds)."""
    if key not in config:
        raise _bad(path, key, f"is missing (the {what})")
    return config[key]


def _from_config(path, where: str, build, *args, **kw):
    """BUILD(*ARGS, **KW), a config class or module built from config field WHERE; its ValueError
    (a ConfigError naming the key at fault, or another) becomes a DataError naming the file and field."""
    try:
        return build(*args, **kw)
    except ValueError as e:
        key, problem = getattr(e, "field", None), getattr(e, "problem", None)
        if problem is None:
            raise _bad(path, where, f"is not usable ({_first_line(e)})") from None
        raise _bad(path, f"{where}.{key}" if key else where, problem) from None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def vae_config(path, config: dict):
    """The VAEConfig of file PATH's config (a DataError naming the field at fault)."""
    from tdiff.models.vae import ENCODER_LM_FIELDS, VAEConfig

    d = _section(path, config, "vae", "VAE's configuration; is this a tdiff model file?")
    spec, required = _dataclass_spec(VAEConfig)
    check_object(path, "vae", d, spec, required)
    if d.get("encoder_lm") is not None:
        check_object(path, "vae.encoder_lm", d["encoder_lm"], ENCODER_LM_FIELDS, tuple(ENCODER_LM_FIELDS))
    return _from_config(path, "vae", VAEConfig.from_dict, d)


def dit_config(path, config: dict, vae_cfg):
    """The DiTConfig of file PATH's config, which must fit its VAE's latents VAE_CFG."""
    from tdiff.models.dit import DiTConfig

    d = _section(path, config, "dit", "denoiser's configuration")
    spec, required = _dataclass_spec(DiTConfig)
    cfg = _from_config(path, "dit", DiTConfig.from_dict, check_object(path, "dit", d, spec, required))
    if cfg.latent_dim != vae_cfg.latent_dim:
        raise _bad(path, "dit.latent_dim", f"must be the VAE's latent_dim ({vae_cfg.latent_dim}), got {cfg.latent_dim}")
    if cfg.max_len != vae_cfg.latent_len:
        raise _bad(path, "dit.max_len", f"must be the VAE's latent positions ({vae_cfg.latent_len}), got {cfg.max_len}")
    return cfg


def check_diffusion(path, config: dict, dit_cfg) -> dict:
    """The `diffusion` section: a known target, and no input the denoiser was not built with."""
    d = check_object(path, "diffusion", _section(path, config, "diffusion", "diffusion process"),
                     DIFFUSION_FIELDS, REQUIRED["diffusion"])
    check_choice(path, "diffusion.target", d["target"], choices.TARGETS, "target")
    if not 0 <= d.get("cond_prob", 0) <= 1:
        raise _bad(path, "diffusion.cond_prob", f"must be in [0, 1], got {d['cond_prob']}")
    if d.get("self_condition", True) and not dit_cfg.self_condition:
        raise _bad(path, "diffusion.self_condition", "is true (or absent) but the denoiser has no "
                   "self-conditioning input (dit.self_condition is false)")
    if d.get("known_spans", False) and not dit_cfg.cond_channels:
        raise _bad(path, "diffusion.known_spans", "is true but the denoiser has no known-span input "
                   "(dit.cond_channels is false)")
    return d


def check_labels(path, config: dict, dit_cfg) -> None:
    """The `labels` section (absent for an unconditional model): one distinct name per class."""
    d = config.get("labels")
    names = [] if d is None else check_object(path, "labels", d, LABELS_FIELDS, REQUIRED["labels"])["names"]
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise _bad(path, "labels.names", f"must be a list of distinct strings, got {_show(names)}")
    if len(names) != dit_cfg.num_labels:
        raise _bad(path, "labels.names", f"must name the denoiser's {dit_cfg.num_labels} labels "
                   f"(dit.num_labels), got {len(names)}")


def check_student(path, config: dict) -> None:
    """The `student` section of a distilled student: its method, steps and solver."""
    d = check_object(path, "student", _section(path, config, "student", "distilled student's settings"),
                     STUDENT_FIELDS, REQUIRED["student"])
    check_choice(path, "student.method", d["method"], choices.DISTILL_METHODS, "method")
    check_choice(path, "student.solver", d["solver"], choices.SOLVERS, "solver")
    if "time_grid" in d:
        check_choice(path, "student.time_grid", d["time_grid"], choices.TIME_GRIDS, "time grid")
    for key in ("steps", "from_steps"):
        if d.get(key, 1) < 1:
            raise _bad(path, f"student.{key}", f"must be >= 1, got {d[key]}")


def check_train(path, train: dict) -> None:
    """The training settings another run reads back (`distill` takes its teacher's label dropout)."""
    tc = train.get("config", {})
    if not isinstance(tc, dict):
        raise DataError(f"{path}: train metadata field 'config' must be a JSON object, got {_show(tc)}")
    dropout = tc.get("label_dropout", 0.0)
    if not (_is(dropout, float) and 0 <= dropout <= 1):
        raise DataError(f"{path}: train metadata field 'config.label_dropout' must be a number in [0, 1], "
                        f"got {_show(dropout)}")


def make_schedule_from(path, config: dict):
    """The noise schedule of file PATH's `schedule` section (its learned parameters not yet loaded)."""
    from tdiff.diffusion.schedules import SCHEDULES, make_schedule

    d = _section(path, config, "schedule", "noise schedule")
    name = check_object(path, "schedule", d, {"name": str}, ("name",), closed=False)["name"]
    check_choice(path, "schedule.name", name, tuple(SCHEDULES), "schedule")
    check_object(path, "schedule", d, {"name": str, **_options_spec(SCHEDULES[name].__init__)})
    return _from_config(path, "schedule", make_schedule, **d)


def make_timewarp_from(path, config: dict):
    """The TimeWarp of file PATH's `timewarp` section, or None without one (curve not yet loaded)."""
    from tdiff.diffusion.timewarp import TimeWarp

    if "timewarp" not in config:
        return None
    d = check_object(path, "timewarp", config["timewarp"], _options_spec(TimeWarp.__init__))
    return _from_config(path, "timewarp", TimeWarp, **d)


# ---------------------------------------------------------------- tensors


def _check_state(module, state: dict, path, prefix: str, what: str) -> None:
    """The tensors STATE (stored under PREFIX.) are exactly MODULE's, with its shapes."""
    own = module.state_dict()
    for k, v in own.items():
        if k not in state:
            raise DataError(f"{path}: tensor '{prefix}.{k}' of the {what} is missing")
        if tuple(state[k].shape) != tuple(v.shape):
            raise DataError(f"{path}: tensor '{prefix}.{k}' has shape {tuple(state[k].shape)}; the {what} "
                            f"of its configuration needs {tuple(v.shape)}")
    for k in state:
        if k not in own:
            raise DataError(f"{path}: tensor '{prefix}.{k}' is no part of the {what} of its configuration")


def _load_state(module, state: dict, path, prefix: str, what: str) -> None:
    """Load STATE (the tensors under PREFIX.) into MODULE; a DataError names the first tensor at fault."""
    _check_state(module, state, path, prefix, what)
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        raise DataError(f"{path}: the {what}'s tensors cannot be loaded ({_first_line(e)})") from None


def _build(path, where: str, make, state: dict, prefix: str, what: str):
    """MAKE() with STATE loaded. The tensors are first checked against a shell built on the meta
    device, so a config with absurd sizes costs no memory; a shell that cannot be built is a
    DataError naming config field WHERE."""
    import torch

    try:
        with torch.device("meta"):
            shell = make()
    except (RuntimeError, ValueError, TypeError, OverflowError, KeyError) as e:
        raise _bad(path, where, f"describes no buildable network ({_first_line(e)})") from None
    _check_state(shell, state, path, prefix, what)
    module = make()
    _load_state(module, state, path, prefix, what)
    return module


# ---------------------------------------------------------------- saving

# The networks' parts of a model file: tensor-name prefix -> required. The EMA denoiser (`dit_ema`) is
# absent from students and slim exports (their `dit` holds the weights to sample with); `schedule` has
# tensors only for a learned schedule; `timewarp` is there exactly when the config has a "timewarp" section.
MODEL_PARTS = {"vae": True, "dit": True, "dit_ema": False, "schedule": False, "timewarp": False}


def save_vae(path, vae_state: dict, config: dict, train: dict, tok) -> None:
    """Write a `vae` file (the one layout `load_vae` reads): VAE_STATE under `vae.`, CONFIG {"vae": …},
    the tokenizer TOK (a Tokenizer) inside."""
    if set(config) != {"vae"}:
        raise ValueError(f"a vae file's config has exactly the section 'vae', got {sorted(config)}")
    artifacts.save_artifact(path, {f"vae.{k}": v for k, v in vae_state.items()}, "vae", config=config,
                            train=train, tokenizer=tok.to_bytes(), tokenizer_meta=tok.meta)


def save_model(path, kind: str, parts: dict, config: dict, train: dict, tok) -> None:
    """Write a `model` or `student` file, the one layout `load_model` reads (used by `tdiff train`,
    `tdiff distill` and `tdiff export --format safetensors`).

    PARTS maps each part of MODEL_PARTS to its state dict (stored as `<part>.<name>`); CONFIG holds
    the sections "vae", "dit", "schedule", "diffusion", and "labels", "timewarp", "student", "export"
    where they apply (a student has "student"; "timewarp" goes with the timewarp part); TRAIN is the
    provenance; TOK the Tokenizer."""
    if kind not in MODEL_KINDS:
        raise ValueError(f"kind {kind!r}: a model file is one of {MODEL_KINDS}")
    unknown = set(parts) - set(MODEL_PARTS)
    missing = [n for n, need in MODEL_PARTS.items() if need and n not in parts]
    if unknown or missing:
        raise ValueError(f"model parts: unknown {sorted(unknown)}, missing {missing}")
    for section in ("vae", "dit", "schedule", "diffusion"):
        if section not in config:
            raise ValueError(f"a {kind} file's config needs the section {section!r}")
    if ("student" in config) != (kind == "student"):
        raise ValueError("a student file, and only a student file, has the config section 'student'")
    if ("timewarp" in config) != ("timewarp" in parts):
        raise ValueError("the config section 'timewarp' and the timewarp part go together")
    tensors = {f"{part}.{k}": v for part, state in parts.items() for k, v in state.items()}
    artifacts.save_artifact(path, tensors, kind, config=config, train=train, tokenizer=tok.to_bytes(),
                            tokenizer_meta=tok.meta)


def model_parts_from(tensors: dict) -> dict:
    """The PARTS of a model file's TENSORS ({"<part>.<name>": tensor}), as `save_model` takes them."""
    parts = {}
    for key, v in tensors.items():
        part, _, name = key.partition(".")
        parts.setdefault(part, {})[name] = v
    return parts


# ---------------------------------------------------------------- loading


def load_vae(path, device="cpu"):
    """(TextVAE in eval mode, Tokenizer, Artifact) from a `vae` or `model` artifact."""
    from tdiff.models.vae import TextVAE

    art = artifacts.load_artifact(path, expect=("vae",) + MODEL_KINDS, device="cpu")
    cfg = vae_config(path, art.config)
    tok = load_tokenizer(art)
    if cfg.vocab_size != tok.vocab_size:
        raise _bad(path, "vae.vocab_size", f"must be its tokenizer's vocabulary size ({tok.vocab_size}), "
                   f"got {cfg.vocab_size}")
    if cfg.pad_id != tok.pad_id:
        raise _bad(path, "vae.pad_id", f"must be its tokenizer's pad id ({tok.pad_id}), got {cfg.pad_id}")
    vae = _build(path, "vae", lambda: TextVAE(cfg), art.sub("vae"), "vae", "VAE")
    return vae.to(device).eval(), tok, art


def load_tokenizer(art):
    """The Tokenizer stored inside artifact ART."""
    from tdiff.text.tokenizer import Tokenizer

    if art.tokenizer is None:
        raise DataError(f"{art.path}: holds no tokenizer")
    return Tokenizer.from_bytes(art.tokenizer, art.tokenizer_meta, name=f"{art.path}: its tokenizer",
                                hint="the file is damaged")


@dataclass
class Bundle:
    vae: object
    dit: object
    schedule: object
    tokenizer: object
    diffusion: dict                      # {"target": "v"|"x0"|"eps", "self_condition": bool}
    config: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    kind: str = "model"
    timewarp: object = None              # TimeWarp of `train --t-sampling adaptive`, else None
    greedy_head: object = None           # a compiled tdiff.sampling.sample.greedy_head (tdiff/sampling/compiled.py), else None

    @property
    def latent_shape(self):
        c = self.dit.config
        return (c.max_len, c.latent_dim)

    @property
    def labels(self) -> list[str]:
        """The label names of a label-conditional model (`train --label-field`), else []."""
        return list(self.config.get("labels", {}).get("names", []))

    @property
    def known_spans(self) -> bool:
        """Whether the model was trained on known spans (diffusion/spans.py): prompts, infilling,
        editing and exact lengths."""
        return bool(self.diffusion.get("known_spans", False))

    def x0_estimate(self, x_t, t, self_cond=None, label=None, cond_x=None, cond_mask=None, round_x0=False,
                    start: int = 0, cache=None):
        """Network output → x0 estimate. x_t (B, N, D); t float (B,) in [0, 1]. The network sees
        the clean known latents at known positions (`spans.merge`, as in training), and they are
        the estimate there. With ROUND_X0 the estimate is snapped through the VAE (`round_x0`)
        before known positions are restored. With CACHE (a block-causal denoiser's keys/values of
        the finished blocks, `DiT.extend_cache`) x_t is the one block at latent positions START…."""
        from tdiff.diffusion.process import pred_to_x0
        from tdiff.diffusion.spans import merge

        x_t = merge(x_t, cond_x, cond_mask)                             # (B, N, D)
        alpha, sigma = self.schedule.alpha_sigma(t.double())           # (B,), float64
        tt = t.to(x_t.dtype)
        if cache is None:
            pred = self.dit(x_t, tt, self_cond=self_cond, label=label, cond_x=cond_x, cond_mask=cond_mask)
        else:
            pred = self.dit.forward_cached(x_t, tt, start, cache, self_cond=self_cond, label=label, cond_x=cond_x,
                                           cond_mask=cond_mask)
        x0 = pred_to_x0(self.diffusion["target"], pred.to(x_t.dtype), x_t,
                        alpha.to(x_t.dtype), sigma.to(x_t.dtype))
        if round_x0:
            x0 = self.round_x0(x0)
        return merge(x0, cond_x, cond_mask)                             # known positions stay known

    def round_x0(self, x0):
        """Snap normalized latents (B, N, D) to the latents of the tokens they decode to:
        decoder argmax, then the encoder's posterior mean (Diffusion-LM's "clamping trick",
        Li et al. 2022 §4.2, through the VAE instead of an embedding table)."""
        vae = self.vae
        ids = vae.decode(vae.denormalize(x0)).argmax(-1)                  # (B, L)
        return vae.normalize(vae.encode(ids)[0]).to(x0.dtype)             # (B, N, D)

    def denoiser(self, label=None, cond_x=None, cond_mask=None, round_x0: bool = False, guidance: float = 0.0,
                 start: int = 0, cache=None):
        """A solver's `denoise(x_t, t)` closure; carries the self-conditioning state between steps.
        With ROUND_X0 every x0 estimate is snapped through the VAE (`round_x0`). START and CACHE: one
        block of a block-causal denoiser (`x0_estimate`; with guidance the cache holds 2B rows).

        With LABEL (B,) and GUIDANCE w > 0: classifier-free guidance (Ho & Salimans 2022, eq. 6,
        written for x0): x̂0 = x̂0(label) + w·(x̂0(label) − x̂0(null)), the two branches run as one
        batch of 2B, each with its own self-conditioning state. w = 0 is plain conditional sampling."""
        import torch

        state = {"prev": None}
        use_sc = self.diffusion.get("self_condition", True)

        def previous(x):
            """The self-conditioning input: the last x0 estimate, zeros before the first (what the
            network assumes for None; given explicitly so a compiled network sees one signature)."""
            if not use_sc:
                return None
            return torch.zeros_like(x) if state["prev"] is None else state["prev"]

        if not guidance or label is None:
            def denoise(x_t, t):
                x0 = self.x0_estimate(x_t, t, self_cond=previous(x_t), label=label, cond_x=cond_x,
                                      cond_mask=cond_mask, round_x0=round_x0, start=start, cache=cache)
                state["prev"] = x0
                return x0

            return denoise

        two = (lambda v: None if v is None else torch.cat([v, v]))           # (B, ...) → (2B, ...)
        labels2 = torch.cat([label, torch.full_like(label, -1)])             # (2B,) conditional, then null
        cond_x2, cond_mask2 = two(cond_x), two(cond_mask)

        def guided(x_t, t):
            x2 = two(x_t)                                                     # (2B, N, D)
            x0 = self.x0_estimate(x2, two(t), self_cond=previous(x2), label=labels2, cond_x=cond_x2,
                                  cond_mask=cond_mask2, round_x0=round_x0, start=start, cache=cache)
            state["prev"] = x0                                                # (2B, N, D): one state per branch
            x0_c, x0_u = x0.chunk(2)                                          # (B, N, D) each
            return x0_c + guidance * (x0_c - x0_u)

        return guided


def load_model(path, device="cpu", use_ema: bool = True) -> Bundle:
    """The whole model from one `model`/`student` artifact; nothing else is read. Every config
    field and tensor is checked first: a damaged file is a DataError naming the file and the field."""
    from tdiff.models.dit import DiT

    vae, tok, art = load_vae(path, device)
    if "dit" not in art.config:
        raise DataError(f"{path}: a VAE file, not a diffusion model (train one with `tdiff train`)")
    dit_cfg = dit_config(path, art.config, vae.config)
    diffusion = check_diffusion(path, art.config, dit_cfg)
    check_labels(path, art.config, dit_cfg)
    if art.kind == "student":
        check_student(path, art.config)
    check_train(path, art.train)
    prefix = "dit_ema" if use_ema and any(k.startswith("dit_ema.") for k in art.tensors) else "dit"
    dit = _build(path, "dit", lambda: DiT(dit_cfg), art.sub(prefix), prefix, "denoiser")
    schedule = make_schedule_from(path, art.config)
    _load_state(schedule, art.sub("schedule"), path, "schedule", "noise schedule")
    _from_config(path, "schedule", schedule.check)
    warp = make_timewarp_from(path, art.config)
    if warp is not None:
        _load_state(warp, art.sub("timewarp"), path, "timewarp", "time warp")
    return Bundle(vae=vae, dit=dit.to(device).eval(), schedule=schedule.to(device).eval(), tokenizer=tok,
                  diffusion=diffusion, config=art.config, train=art.train, kind=art.kind, timewarp=warp)
