"""One save/load pair per artifact kind (tdiff/formats): what a writer saves, the reader loads back
unchanged; a writer refuses a layout its reader would not take; an export directory is checked
against its manifest."""

from __future__ import annotations

import pytest
import torch

from conftest import run_cli
from tdiff.files.artifacts import load_artifact
from tdiff.formats.model import load_model, load_tokenizer, load_vae, model_parts_from, save_model, save_vae


def test_a_model_saved_from_its_parts_loads_back_equal(work, tmp_path):
    art = load_artifact(work / "model.safetensors")
    parts = model_parts_from(art.tensors)
    assert {"vae", "dit", "dit_ema"} <= set(parts) and set(parts) <= {"vae", "dit", "dit_ema", "schedule", "timewarp"}
    tok = load_tokenizer(art)
    save_model(tmp_path / "m.safetensors", "model", parts, art.config, art.train, tok)
    again = load_artifact(tmp_path / "m.safetensors")
    assert again.kind == "model" and again.config == art.config and again.train == art.train
    assert again.tensors.keys() == art.tensors.keys()
    assert all(torch.equal(again.tensors[k], art.tensors[k]) for k in art.tensors)
    a, b = load_model(work / "model.safetensors"), load_model(tmp_path / "m.safetensors")
    assert all(torch.equal(x, y) for x, y in zip(a.dit.state_dict().values(), b.dit.state_dict().values()))


def test_a_vae_saved_loads_back(work, tmp_path):
    vae, tok, art = load_vae(work / "vae.safetensors")
    save_vae(tmp_path / "v.safetensors", vae.state_dict(), art.config, art.train, tok)
    v2, tok2, _ = load_vae(tmp_path / "v.safetensors")
    assert tok2.vocab_size == tok.vocab_size
    assert all(torch.equal(x, y) for x, y in zip(vae.state_dict().values(), v2.state_dict().values()))


@pytest.mark.parametrize("change,words", [
    (lambda kind, parts, cfg: ("vae", parts, cfg), "kind 'vae'"),
    (lambda kind, parts, cfg: (kind, {k: v for k, v in parts.items() if k != "dit"}, cfg), "missing \\['dit'\\]"),
    (lambda kind, parts, cfg: (kind, {**parts, "extra": {}}, cfg), "unknown \\['extra'\\]"),
    (lambda kind, parts, cfg: (kind, parts, {k: v for k, v in cfg.items() if k != "diffusion"}), "'diffusion'"),
    (lambda kind, parts, cfg: ("student", parts, cfg), "'student'"),
])
def test_save_model_refuses_a_layout_load_model_would_not_take(work, tmp_path, change, words):
    art = load_artifact(work / "model.safetensors")
    kind, parts, cfg = change("model", model_parts_from(art.tensors), dict(art.config))
    with pytest.raises(ValueError, match=words):
        save_model(tmp_path / "m.safetensors", kind, parts, cfg, {}, load_tokenizer(art))
    assert not (tmp_path / "m.safetensors").exists()


def test_load_export_checks_every_file_against_the_manifest(work, tmp_path):
    from tdiff.core.errors import DataError
    from tdiff.formats.export_dir import load_export

    out = tmp_path / "ex"
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", out, "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    e = load_export(out)
    assert e["config"]["format"] == "safetensors" and {"config.json", "model.safetensors"} <= set(e["files"])
    assert load_model(out / "model.safetensors").kind == "model"
    with open(out / "config.json", "a", encoding="utf-8") as f:
        f.write(" ")
    with pytest.raises(DataError, match="config.json changed since `tdiff export` wrote it"):
        load_export(out)
    with pytest.raises(DataError, match="not a `tdiff export` directory"):
        load_export(tmp_path)


def test_export_no_ema_keeps_the_raw_denoiser(work, tmp_path):
    """`tdiff export --no-ema` exports the raw training weights, as `sample --no-ema` samples with them."""
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", tmp_path / "raw", "--no-ema", "--quiet"])
    assert r.returncode == 0, r.stderr.decode()
    raw, slim = load_model(work / "model.safetensors", use_ema=False), load_model(tmp_path / "raw" / "model.safetensors")
    assert all(torch.equal(x, y) for x, y in zip(raw.dit.state_dict().values(), slim.dit.state_dict().values()))
    ema = load_model(work / "model.safetensors")
    assert any(not torch.equal(x, y) for x, y in zip(ema.dit.state_dict().values(), slim.dit.state_dict().values()))
    assert load_artifact(tmp_path / "raw" / "model.safetensors").config["export"]["ema"] is False
