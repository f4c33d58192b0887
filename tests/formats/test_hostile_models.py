"""Hostile model files: a model, student or VAE file whose stored config or tensors were damaged
or crafted is refused on load with exit 65 and one line naming the file and the field (or tensor)
at fault, never a traceback, in every command that reads one (tdiff/formats/model.py checks them all).

Each case rewrites a real file: `load_artifact`, change its config dict (or tensors), `save_artifact`.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import one_line_error, run_cli
from tdiff.files.artifacts import load_artifact, save_artifact

STUDENT = {"method": "progressive", "steps": 2, "solver": "ddim", "time_grid": "uniform", "from_steps": 4,
           "rounds": [2], "teacher": {"file": "model.safetensors", "sha256": "0" * 64}}
ENCODER_LM = {"vocab_size": 600, "n_positions": 200, "n_embd": 64, "n_layer": 1, "n_head": 4, "bos_token_id": 1,
              "pad_token_id": 3, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}


def _set(cfg: dict, field: str, value) -> None:
    """Set (or, for value DEL, delete) the dotted FIELD of CFG."""
    *parents, last = field.split(".")
    for key in parents:
        cfg = cfg[key]
    if value is DEL:
        del cfg[last]
    else:
        cfg[last] = value


DEL = object()


def craft(src, dst, kind=None, config=None, tensors=None, tokenizer=None, train=None):
    """DST: the file SRC with its kind, config, tensors and train metadata edited by the functions
    CONFIG(cfg), TENSORS(tensors) and TRAIN(train) (in place), and TOKENIZER bytes if given."""
    art = load_artifact(src)
    cfg, tens, info = copy.deepcopy(art.config), dict(art.tensors), copy.deepcopy(art.train)
    for edit, what in ((config, cfg), (tensors, tens), (train, info)):
        if edit:
            edit(what)
    save_artifact(dst, tens, kind or art.kind, cfg, info, tokenizer or art.tokenizer, art.tokenizer_meta)
    return dst


def as_student(cfg):
    cfg["student"] = copy.deepcopy(STUDENT)
    cfg["diffusion"]["self_condition"] = False


def fields(*edits):
    """A config edit setting each (field, value) of EDITS."""
    def edit(cfg):
        for field, value in edits:
            _set(cfg, field, value)
    return edit


def student(*edits):
    """A config edit making a student of the model, then setting EDITS."""
    def edit(cfg):
        as_student(cfg)
        fields(*edits)(cfg)
    return edit


def _shape(key, shape):
    def edit(tens):
        tens[key] = torch.zeros(shape)
    return edit


def _drop(key):
    def edit(tens):
        del tens[key]
    return edit


# (id, config edit, tensor edit, kind, words the one-line error must hold besides the file name)
MODEL_CASES = [
    ("no schedule", fields(("schedule", DEL)), None, None, ["'schedule'", "missing"]),
    ("no diffusion", fields(("diffusion", DEL)), None, None, ["'diffusion'", "missing"]),
    ("unknown schedule", fields(("schedule.name", "foo")), None, None, ["'schedule.name'", "'foo'", "cosine"]),
    ("schedule name a number", fields(("schedule.name", 3)), None, None, ["'schedule.name'", "a string"]),
    ("schedule option of another schedule", fields(("schedule.knots", 4)), None, None, ["'schedule.knots'", "unknown"]),
    ("schedule bound NaN", fields(("schedule.logsnr_min", float("nan"))), None, None,
     ["'schedule.logsnr_min'", "finite"]),
    ("schedule bounds crossed", fields(("schedule.logsnr_min", 20.0)), None, None, ["'schedule.logsnr_max'"]),
    ("schedule overflows", fields(("schedule", {"name": "linear", "beta0": 1e200, "beta1": 1e201})), None, None,
     ["'schedule'"]),
    ("learned schedule without tensors", fields(("schedule", {"name": "learned"})), None, None,
     ["'schedule.raw_delta'", "missing"]),
    ("unknown target", fields(("diffusion.target", "foo")), None, None, ["'diffusion.target'", "'foo'", "eps"]),
    ("no target", fields(("diffusion.target", DEL)), None, None, ["'diffusion.target'", "missing"]),
    ("self_condition a number", fields(("diffusion.self_condition", 1)), None, None,
     ["'diffusion.self_condition'", "true or false"]),
    ("self_condition the denoiser lacks", fields(("dit.self_condition", False)), None, None,
     ["'diffusion.self_condition'"]),
    ("cond_prob out of range", fields(("diffusion.cond_prob", 2)), None, None, ["'diffusion.cond_prob'"]),
    ("timewarp not an object", fields(("timewarp", 5)), None, None, ["'timewarp'", "JSON object"]),
    ("timewarp bins a float", fields(("timewarp.bins", 1.5)), None, None, ["'timewarp.bins'", "integer"]),
    ("timewarp bins too few", fields(("timewarp.bins", 1)), None, None, ["'timewarp.bins'"]),
    ("timewarp bins vs its curve", fields(("timewarp.bins", 32)), None, None, ["'timewarp.curve'", "shape"]),
    ("timewarp momentum a string", fields(("timewarp.momentum", "x")), None, None, ["'timewarp.momentum'"]),
    ("labels.names a number", fields(("labels", {"names": 3})), None, None, ["'labels.names'", "a list"]),
    ("labels vs num_labels", fields(("labels", {"field": "y", "names": ["a", "b"]})), None, None,
     ["'labels.names'", "num_labels"]),
    ("labels not strings", fields(("labels", {"names": [1, 2]}), ("dit.num_labels", 2)), None, None,
     ["'labels.names'", "strings"]),
    ("dit a list", fields(("dit", [])), None, None, ["'dit'", "JSON object"]),
    ("dit size a float", fields(("dit.latent_dim", 16.5)), None, None, ["'dit.latent_dim'", "integer"]),
    ("dit size a bool", fields(("dit.n_layers", True)), None, None, ["'dit.n_layers'", "integer"]),
    ("dit size huge", fields(("dit.d_model", 10 ** 30)), None, None, ["'dit.d_model'"]),
    ("dit heads zero", fields(("dit.n_heads", 0)), None, None, ["'dit.n_heads'"]),
    ("dit unknown mlp", fields(("dit.mlp", "relu")), None, None, ["'dit.mlp'", "swiglu"]),
    ("dit unknown key", fields(("dit.depth", 3)), None, None, ["'dit.depth'", "unknown"]),
    ("dit vs VAE latents", fields(("dit.latent_dim", 8)), None, None, ["'dit.latent_dim'", "16"]),
    ("dit layers vs tensors", fields(("dit.n_layers", 3)), None, None, ["'dit_ema.blocks.3."]),
    ("vae size a float", fields(("vae.latent_dim", 16.5)), None, None, ["'vae.latent_dim'", "integer"]),
    ("vae vocab a string", fields(("vae.vocab_size", "600")), None, None, ["'vae.vocab_size'", "integer"]),
    ("vae missing", fields(("vae", DEL)), None, None, ["'vae'", "missing"]),
    ("vae max_len huge", fields(("vae.max_len", 10 ** 12)), None, None, ["'vae.max_len'"]),
    ("vae encoder_lm incomplete", fields(("vae.encoder_lm", {"vocab_size": 600})), None, None,
     ["'vae.encoder_lm.", "missing"]),
    ("denoiser tensor missing", None, _drop("dit_ema.final.linear.weight"), None,
     ["'dit_ema.final.linear.weight'", "missing"]),
    ("denoiser tensor misshapen", None, _shape("dit_ema.pos_emb", (3, 3)), None, ["'dit_ema.pos_emb'", "shape"]),
    ("stray tensor", None, _shape("dit_ema.extra", (2,)), None, ["'dit_ema.extra'"]),
    ("student without steps", student(("student.steps", DEL)), None, "student", ["'student.steps'", "missing"]),
    ("student steps a string", student(("student.steps", "4")), None, "student", ["'student.steps'", "integer"]),
    ("student steps zero", student(("student.steps", 0)), None, "student", ["'student.steps'"]),
    ("student unknown method", student(("student.method", "fast")), None, "student",
     ["'student.method'", "progressive"]),
    ("student unknown solver", student(("student.solver", "rk4")), None, "student", ["'student.solver'", "ddim"]),
    ("student entry a number", student(("student", 3)), None, "student", ["'student'", "JSON object"]),
    ("student entry missing", student(("student", DEL)), None, "student", ["'student'", "missing"]),
]

VAE_CASES = [
    ("stride unknown", fields(("vae.latent_stride", 3)), None, ["'vae.latent_stride'", "1, 2, 4"]),
    ("size vs tensors", fields(("vae.d_model", 64)), None, ["'vae.tok_emb.weight'", "shape"]),
    ("pad id vs tokenizer", fields(("vae.pad_id", 5)), None, ["'vae.pad_id'", "tokenizer"]),
    ("rope base negative", fields(("vae.rope_base", -1.0)), None, ["'vae.rope_base'"]),
    ("unknown key", fields(("vae.n_layer", 2)), None, ["'vae.n_layer'", "unknown"]),
    ("encoder_lm a number", fields(("vae.encoder_lm", 7)), None, ["'vae.encoder_lm'", "JSON object"]),
    ("encoder_lm unknown activation", fields(("vae.encoder_lm", {**ENCODER_LM, "activation_function": "nope"})),
     None, ["'vae.encoder_lm.activation_function'"]),
    ("encoder_lm without its tensors", fields(("vae.encoder_lm", ENCODER_LM)), None, ["'vae.lm_in.weight'", "missing"]),
    ("tensor missing", None, _drop("vae.lm_head.weight"), ["'vae.lm_head.weight'", "missing"]),
]


def _one_line(r, *words):
    err = one_line_error(r, 65, "m.safetensors", *words)
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("config,tensors,kind,words", [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES])
def test_crafted_model_is_a_data_error(work, tmp_path, capsys, config, tensors, kind, words):
    m = craft(work / "model.safetensors", tmp_path / "m.safetensors", kind, config, tensors)
    _one_line(run_cli(["sample", "-m", m, "-n", "1", "--steps", "1", "--quiet"]), *words)


@pytest.mark.parametrize("config,tensors,words", [c[1:] for c in VAE_CASES], ids=[c[0] for c in VAE_CASES])
def test_crafted_vae_is_a_data_error(work, tmp_path, capsys, config, tensors, words):
    vae = craft(work / "vae.safetensors", tmp_path / "m.safetensors", None, config, tensors)
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", vae, "-o", tmp_path / "out.safetensors",
                        "--max-steps", "1", "--device", "cpu", "--quiet"])
    _one_line(r, *words)
    assert not (tmp_path / "out.safetensors").exists()


def test_damaged_tokenizer_names_the_file(work, tmp_path, capsys):
    m = craft(work / "model.safetensors", tmp_path / "m.safetensors", tokenizer=b"not a sentencepiece model")
    _one_line(run_cli(["sample", "-m", m, "-n", "1", "--steps", "1", "--quiet"]), "tokenizer")


@pytest.mark.parametrize("value", ["0.1", None, 2])
def test_crafted_label_dropout_a_teacher_passes_on_is_a_data_error(work, tmp_path, capsys, value):
    """`distill` reads its teacher's training label dropout back from the train metadata."""
    m = craft(work / "model.safetensors", tmp_path / "m.safetensors", train=fields(("config.label_dropout", value)))
    _one_line(run_cli(["sample", "-m", m, "-n", "1", "--steps", "1", "--quiet"]),
              "'config.label_dropout'")


def test_well_formed_crafted_student_samples_with_its_steps(work, tmp_path, capsys):
    """The control: the crafting itself keeps a file loadable, so the cases above fail for their edit."""
    m = craft(work / "model.safetensors", tmp_path / "m.safetensors", "student", as_student)
    r = run_cli(["sample", "-m", m, "-n", "1", "--seed", "3"])
    assert r.returncode == 0, r.stderr.decode()
    assert '"steps": 2' in r.stdout.decode() and '"solver": "ddim"' in r.stdout.decode()


READERS = {"sample": lambda m, w, out: ["sample", "-m", m, "-n", "1", "--steps", "1"],
           "eval": lambda m, w, out: ["eval", "-m", m, "--data", w / "ids.jsonl"],
           "distill": lambda m, w, out: ["distill", "-i", w / "ids.jsonl", "-m", m, "-o", out, "--max-steps", "1",
                                         "--device", "cpu"],
           "export": lambda m, w, out: ["export", "-m", m, "-o", out],
           "train --vae": lambda m, w, out: ["train", "-i", w / "ids.jsonl", "--vae", m, "-o", out, "--max-steps", "1",
                                             "--device", "cpu"]}
# (command, field, value): the VAE's config is read by all five, the diffusion settings by all but train --vae
READER_CASES = ([(cmd, "vae.latent_dim", 16.5) for cmd in READERS]
                + [(cmd, "diffusion.target", "foo") for cmd in READERS if cmd != "train --vae"])


@pytest.mark.parametrize("cmd,field,value", READER_CASES, ids=[f"{c} {f}" for c, f, _ in READER_CASES])
def test_every_reader_refuses_a_crafted_model(work, tmp_path, capsys, cmd, field, value):
    m = craft(work / "model.safetensors", tmp_path / "m.safetensors", config=fields((field, value)))
    out = tmp_path / "out"
    _one_line(run_cli([*READERS[cmd](m, work, out), "--quiet"]), f"'{field}'")
    assert not out.exists()
