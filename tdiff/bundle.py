"""A trained text diffusion model as one object: tokenizer + VAE + DiT + schedule.

Built from the self-contained `model.safetensors` (kind `model` or `student`)
or from a `vae.safetensors` while training the denoiser. `x0_estimate` is the
function every solver calls: it runs the network (with self-conditioning and
optional span conditioning) and turns its x0/eps/v output into an x0 estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tdiff.errors import DataError
from tdiff import artifacts

MODEL_KINDS = ("model", "student")


def load_vae(path, device="cpu"):
    """(TextVAE in eval mode, Tokenizer, Artifact) from a `vae` or `model` artifact."""
    from tdiff.models.vae import TextVAE, VAEConfig

    art = artifacts.load_artifact(path, expect=("vae",) + MODEL_KINDS, device="cpu")
    if "vae" not in art.config:
        raise DataError(f"{path}: holds no VAE configuration")
    try:
        vae = TextVAE(VAEConfig.from_dict(art.config["vae"]))
    except ValueError as e:
        raise DataError(f"{path}: {e}") from None
    _load_state(vae, art.sub("vae"), path, "VAE")
    return vae.to(device).eval(), load_tokenizer(art), art


def load_tokenizer(art):
    """The Tokenizer stored inside artifact ART."""
    from tdiff.text.tokenizer import Tokenizer

    if art.tokenizer is None:
        raise DataError(f"{art.path}: holds no tokenizer")
    return Tokenizer.from_bytes(art.tokenizer, art.tokenizer_meta)


def _load_state(module, state, path, what):
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        raise DataError(f"{path}: {what} weights do not match its configuration ({str(e).splitlines()[0]})") from None


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
    greedy_head: object = None           # a compiled tdiff.sample.greedy_head (tdiff/compiled.py), else None

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

    def x0_estimate(self, x_t, t, self_cond=None, label=None, cond_x=None, cond_mask=None, round_x0=False):
        """Network output → x0 estimate. x_t (B, N, D); t float (B,) in [0, 1]. The network sees
        the clean known latents at known positions (`spans.merge`, as in training), and they are
        the estimate there. With ROUND_X0 the estimate is snapped through the VAE (`round_x0`)
        before known positions are restored."""
        from tdiff.diffusion.process import pred_to_x0
        from tdiff.diffusion.spans import merge

        x_t = merge(x_t, cond_x, cond_mask)                             # (B, N, D)
        alpha, sigma = self.schedule.alpha_sigma(t.double())           # (B,), float64
        tt = t.to(x_t.dtype)
        pred = self.dit(x_t, tt, self_cond=self_cond, label=label, cond_x=cond_x, cond_mask=cond_mask)
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

    def denoiser(self, label=None, cond_x=None, cond_mask=None, round_x0: bool = False, guidance: float = 0.0):
        """A solver's `denoise(x_t, t)` closure; carries the self-conditioning state between steps.
        With ROUND_X0 every x0 estimate is snapped through the VAE (`round_x0`).

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
                x0 = self.x0_estimate(x_t, t, self_cond=previous(x_t),
                                      label=label, cond_x=cond_x, cond_mask=cond_mask, round_x0=round_x0)
                state["prev"] = x0
                return x0

            return denoise

        two = (lambda v: None if v is None else torch.cat([v, v]))           # (B, ...) → (2B, ...)
        labels2 = torch.cat([label, torch.full_like(label, -1)])             # (2B,) conditional, then null
        cond_x2, cond_mask2 = two(cond_x), two(cond_mask)

        def guided(x_t, t):
            x2 = two(x_t)                                                     # (2B, N, D)
            x0 = self.x0_estimate(x2, two(t), self_cond=previous(x2),
                                  label=labels2, cond_x=cond_x2, cond_mask=cond_mask2, round_x0=round_x0)
            state["prev"] = x0                                                # (2B, N, D): one state per branch
            x0_c, x0_u = x0.chunk(2)                                          # (B, N, D) each
            return x0_c + guidance * (x0_c - x0_u)

        return guided


def load_bundle(path, device="cpu", use_ema: bool = True) -> Bundle:
    """The whole model from one `model`/`student` artifact; nothing else is read."""
    from tdiff.diffusion.schedules import make_schedule
    from tdiff.models.dit import DiT, DiTConfig

    vae, tok, art = load_vae(path, device)
    if "dit" not in art.config:
        raise DataError(f"{path}: a VAE file, not a diffusion model (train one with `tdiff train`)")
    try:
        dit = DiT(DiTConfig.from_dict(art.config["dit"]))
    except (ValueError, TypeError) as e:
        raise DataError(f"{path}: {e}") from None
    prefix = "dit_ema" if use_ema and any(k.startswith("dit_ema.") for k in art.tensors) else "dit"
    _load_state(dit, art.sub(prefix), path, "denoiser")
    schedule = make_schedule(**art.config["schedule"])
    sched_state = art.sub("schedule")
    if sched_state:
        _load_state(schedule, sched_state, path, "schedule")
    warp = None
    if "timewarp" in art.config:
        from tdiff.diffusion.timewarp import TimeWarp

        warp = TimeWarp(**art.config["timewarp"])
        _load_state(warp, art.sub("timewarp"), path, "time warp")
    return Bundle(vae=vae, dit=dit.to(device).eval(), schedule=schedule.to(device).eval(), tokenizer=tok,
                  diffusion=art.config["diffusion"], config=art.config, train=art.train, kind=art.kind,
                  timewarp=warp)
