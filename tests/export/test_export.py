"""`tdiff export` (slim safetensors, torch.export, TorchScript, ONNX; verified), the standalone
example that samples from an export without tdiff, and the inference-speed options of `sample`
(`--compile`, `--dtype auto`, the chunked greedy head)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, run_cli

EXAMPLE = ROOT / "examples" / "sample_exported.py"


def _err(r) -> str:
    return r.stderr.decode("utf-8", "replace")


def _records(r) -> list[dict]:
    assert r.returncode == 0, _err(r)
    return [json.loads(line) for line in r.stdout.decode().splitlines()]


def _export(work, out, *args):
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", out, *args])
    assert r.returncode == 0, _err(r)
    return r


@pytest.fixture(scope="module")
def exported(work, tmp_path_factory):
    """The `work` model exported as torch.export programs in fp32."""
    out = tmp_path_factory.mktemp("exp") / "programs"
    _export(work, out, "--format", "export")
    return out


# ---------------------------------------------------------------- slim safetensors


def test_slim_export_samples_the_same_tokens_in_fp32(work, tmp_path):
    r = _export(work, tmp_path / "slim")
    assert "max |export - source| / max |source|" in _err(r) and "verified" in _err(r)
    slim = tmp_path / "slim" / "model.safetensors"
    cfg = json.loads((tmp_path / "slim" / "config.json").read_text())
    assert cfg["format"] == "safetensors" and all(c["rel_error"] <= c["tolerance"] for c in cfg["verify"]["checks"].values())
    from tdiff.files.artifacts import load_artifact

    art = load_artifact(slim)
    assert art.kind == "model" and art.config["export"]["dtype"] == "fp32"
    assert not any(k.startswith("dit_ema.") for k in art.tensors)            # the EMA weights, stored as `dit`
    src = load_artifact(work / "model.safetensors")
    assert torch.equal(art.tensors["dit.in_proj.weight"], src.tensors["dit_ema.in_proj.weight"])
    assert slim.stat().st_size < (work / "model.safetensors").stat().st_size
    args = ["-n", "6", "--batch-size", "4", "--seed", "3", "--dtype", "fp32", "-q"]
    a = _records(run_cli(["sample", "-m", work / "model.safetensors", *args]))
    b = _records(run_cli(["sample", "-m", slim, *args]))
    assert [x["ids"] for x in a] == [y["ids"] for y in b]


def test_bf16_slim_export_is_half_the_size_and_samples(work, tmp_path):
    _export(work, tmp_path / "half", "--dtype", "bf16")
    slim = tmp_path / "half" / "model.safetensors"
    from tdiff.files.artifacts import load_artifact

    art = load_artifact(slim)
    assert art.tensors["dit.in_proj.weight"].dtype == torch.bfloat16
    assert art.tensors["vae.latent_std"].dtype == torch.float32                # statistics stay exact
    fp32 = _export(work, tmp_path / "full") and (tmp_path / "full" / "model.safetensors")
    assert slim.stat().st_size < 0.6 * fp32.stat().st_size
    a = _records(run_cli(["sample", "-m", fp32, "-n", "8", "--batch-size", "8", "--dtype", "fp32", "-q"]))
    b = _records(run_cli(["sample", "-m", slim, "-n", "8", "--batch-size", "8", "--dtype", "fp32", "-q"]))
    same = sum(i == j for x, y in zip(a, b) for i, j in zip(x["ids"], y["ids"]))
    assert same >= 0.9 * sum(len(x["ids"]) for x in a)                        # rounding flips only a few tokens


# ---------------------------------------------------------------- programs


def _library_outputs(model_path, inputs):
    from tdiff.formats.model import load_model
    from tdiff.export.programs import program_modules

    mods = program_modules(load_model(model_path, "cpu"), "fp32")
    with torch.inference_mode():
        return {k: mods[k](*v) for k, v in inputs.items()}


@pytest.mark.parametrize("fmt", ["export", "torchscript"])
def test_programs_match_the_source_at_any_batch_size(work, tmp_path, exported, fmt):
    out = exported if fmt == "export" else tmp_path / fmt
    if fmt != "export":
        _export(work, out, "--format", fmt)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["format"] == fmt and set(cfg["programs"]) == {"denoiser", "decoder", "schedule"}
    assert all(c["rel_error"] <= c["tolerance"] for c in cfg["verify"]["checks"].values())
    from tdiff.formats.model import load_model
    from tdiff.export.programs import example_inputs

    inputs = example_inputs(load_model(work / "model.safetensors"), batch=5, seed=7)   # a batch never traced
    ref = _library_outputs(work / "model.safetensors", inputs)
    from tdiff.export.programs import SAVERS

    load = SAVERS[fmt][1]
    for name, file in cfg["programs"].items():
        with torch.inference_mode():
            got = load(out / file)(*inputs[name])
        assert got.shape == ref[name].shape
        assert torch.allclose(got, ref[name], atol=1e-4, rtol=1e-4), name


def test_onnx_export_verifies(work, tmp_path):
    from tdiff.export.programs import onnx_problem

    if onnx_problem():
        pytest.skip(onnx_problem())
    _export(work, tmp_path / "onnx", "--format", "onnx")
    cfg = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert {c["file"] for c in cfg["verify"]["checks"].values()} == {"denoiser.onnx", "decoder.onnx", "schedule.onnx"}
    assert all(c["rel_error"] <= 1e-4 for c in cfg["verify"]["checks"].values())


# ---------------------------------------------------------------- the standalone example


def test_example_imports_no_tdiff():
    import re

    assert not re.search(r"^\s*(import|from)\s+tdiff\b", EXAMPLE.read_text(), re.M)


def test_example_runs_with_tdiff_hidden(exported, tmp_path):
    """The example in a process where `import tdiff` fails (as in a venv without it)."""
    code = ("import sys, runpy; sys.modules['tdiff'] = None; "
            f"sys.argv = ['sample_exported', {str(exported)!r}, '-n', '3', '--batch-size', '2', '--seed', '1']; "
            f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=tmp_path, env=env, timeout=300)
    recs = _records(r)
    assert len(recs) == 3 and [x["index"] for x in recs] == [0, 1, 2]
    assert all(x["ids"] and x["steps"] == 12 and x["solver"] == "dpm" for x in recs)


def test_example_samples_what_tdiff_samples(work, exported):
    """The same noise through the example's solver and programs, and through tdiff's sampling path:
    the same token ids (fp32 export)."""
    spec = importlib.util.spec_from_file_location("sample_exported", EXAMPLE)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    cfg, progs, sp = ex.load(exported)
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import SampleOptions, latents_to_ids, sample_latents, trim_ids

    bundle = load_model(work / "model.safetensors")
    for solver, steps in (("dpm", 12), ("ddim", 5)):
        opts = SampleOptions(steps=steps, solver=solver)
        z = sample_latents(bundle, 4, opts, torch.Generator().manual_seed(5), torch.device("cpu"))
        want = latents_to_ids(bundle, z, opts, None)
        noise = torch.randn(4, cfg["latent_len"], cfg["latent_dim"], generator=torch.Generator().manual_seed(5))
        with torch.inference_mode():
            got = ex.decode_ids(cfg, progs, ex.solve(cfg, progs, noise, steps, solver))
        assert torch.equal(got, want), solver
    row = want[0].tolist()
    assert ex.trim(cfg, row) == trim_ids(row, bundle.tokenizer)
    table = ex.byte_table(sp)
    kept = ex.trim(cfg, row)
    assert b"".join(table[i] for i in kept).decode("utf-8", "ignore") == bundle.tokenizer.decode(kept)


# ---------------------------------------------------------------- bad input, nothing lost


def test_bad_exports_are_refused_and_lose_nothing(work, tmp_path):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    cases = [
        (["-o", other], 73, "not written by `tdiff export`"),
        (["-o", "-"], 2, "directory, not stdout"),
        (["-o", tmp_path / "o", "--format", "onnx", "--dtype", "bf16"], 2, "bf16"),
        (["-o", tmp_path / "o", "--format", "pickle"], 2, "--format"),
        (["-o", tmp_path / "o", "--dtype", "fp8"], 2, "--dtype"),
    ]
    for args, code, words in cases:
        r = run_cli(["export", "-m", work / "model.safetensors", *args])
        assert r.returncode == code, (args, _err(r))
        assert words in _err(r) and "Traceback" not in _err(r), _err(r)
    for model, code in ((work / "vae.safetensors", 65), (tmp_path / "absent.safetensors", 66)):
        r = run_cli(["export", "-m", model, "-o", tmp_path / "o"])
        assert r.returncode == code and "Traceback" not in _err(r), _err(r)
    assert (other / "notes.txt").read_text() == "keep me"
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]            # no temp directory left behind


def test_a_failed_check_leaves_the_old_export(work, tmp_path, monkeypatch):
    from tdiff.export import programs as E
    from tdiff.core.errors import OutputError

    out = tmp_path / "slim"
    E.export_model(work / "model.safetensors", out, "safetensors", "fp32")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setitem(E.TOLERANCE, "bf16", 0.0)                            # bf16 rounding cannot pass
    with pytest.raises(OutputError, match="differs from the source"):
        E.export_model(work / "model.safetensors", out, "safetensors", "bf16")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slim"]
    E.export_model(work / "model.safetensors", out, "export", "fp32")        # an export directory is replaced
    assert (out / "denoiser.pt2").exists() and not (out / "model.safetensors").exists()


# ---------------------------------------------------------------- speed options of sample


def test_chunked_greedy_head_equals_the_full_argmax(work, monkeypatch):
    from tdiff.sampling import sample as S
    from tdiff.formats.model import load_model

    bundle = load_model(work / "model.safetensors")
    n, d = bundle.latent_shape
    z = torch.randn(5, n, d, generator=torch.Generator().manual_seed(0))
    must = torch.zeros(5, n, dtype=torch.bool)
    must[:, :3] = True
    opts = S.SampleOptions()
    with torch.no_grad():
        logits = bundle.vae.decode(bundle.vae.denormalize(z))
    tok = bundle.tokenizer
    logits[..., [tok.pad_id, tok.bos_id, tok.eos_id]] = torch.where(
        must[..., None], float("-inf"), logits[..., [tok.pad_id, tok.bos_id, tok.eos_id]])
    want = logits.argmax(-1)
    monkeypatch.setattr(S, "GREEDY_ROWS", 7)                                  # chunks that cut rows mid-sequence
    assert torch.equal(S.latents_to_ids(bundle, z, opts, None, must_text=must), want)


def test_dtype_auto_follows_the_hardware(work):
    from tdiff.core.device import fast_bf16, resolve_dtype

    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == ("bf16" if fast_bf16(cpu) else "fp32")
    assert resolve_dtype("fp32", cpu) == "fp32"
    r = run_cli(["sample", "-m", work / "model.safetensors", "-n", "1", "--device", "cpu"])
    assert r.returncode == 0 and f"on cpu, {resolve_dtype('auto', cpu)}" in _err(r), _err(r)


@pytest.mark.slow
def test_compile_samples_what_eager_samples(work):
    from tdiff.sampling.compiled import compile_problem

    if compile_problem(torch.device("cpu")):
        pytest.skip(compile_problem(torch.device("cpu")))
    args = ["-n", "5", "--batch-size", "4", "--seed", "2", "--dtype", "fp32", "--device", "cpu", "-q"]   # last batch padded
    eager = _records(run_cli(["sample", "-m", work / "model.safetensors", *args]))
    comp = _records(run_cli(["sample", "-m", work / "model.safetensors", "--compile", *args]))
    same = sum(i == j for x, y in zip(eager, comp) for i, j in zip(x["ids"], y["ids"]))
    assert len(comp) == 5 and same >= 0.98 * sum(len(x["ids"]) for x in eager)
    r = run_cli(["eval", "-m", work / "model.safetensors", "--speed", "--compile", "--repeats", "1",
                   "--batch-size", "2", "--device", "cpu", "-q"])
    speed = json.loads(r.stdout)["speed"]
    assert r.returncode == 0 and speed["compile"] is True and speed["warmup_s"] and speed["tokens_per_s"] > 0


def test_compile_is_refused_where_it_cannot_work(work):
    r = run_cli(["eval", "-m", work / "model.safetensors", "--compile", "--data", work / "ids.jsonl"])
    assert r.returncode == 2 and "--compile: only with --speed" in _err(r)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA paths: needs a GPU")
def test_compile_with_cuda_graphs(work):
    args = ["-n", "4", "--batch-size", "4", "--device", "cuda", "-q"]
    eager = _records(run_cli(["sample", "-m", work / "model.safetensors", "--dtype", "fp32", *args]))
    comp = _records(run_cli(["sample", "-m", work / "model.safetensors", "--dtype", "fp32", "--compile", *args]))
    same = sum(i == j for x, y in zip(eager, comp) for i, j in zip(x["ids"], y["ids"]))
    assert same >= 0.98 * sum(len(x["ids"]) for x in eager)


# ---------------------------------------------------------------- what -o may replace, in process

from conftest import one_line_error  # noqa: E402


def _tree(d) -> dict:
    """{relative path: bytes (None for a folder)} of everything under D, links not followed."""
    return {str(p.relative_to(d)): None if p.is_dir() else p.read_bytes() for p in sorted(d.rglob("*"))}


def _temps(d) -> list:
    """The hidden entries (temp folders) in D."""
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def _user_dir(path, files: dict):
    """A user's directory PATH holding FILES {name: text}."""
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _fake_manifest(d, seal: str) -> str:
    """A manifest of D's files in export's layout, with the right sizes and hashes and the seal SEAL."""
    import hashlib

    files = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(d.iterdir())}
    return json.dumps({"tdiff_export_manifest": 1, "files": files, "seal": seal})


@pytest.mark.parametrize("case", ["config-holds-1", "marker-in-notes", "manifest-holds-1", "manifest-unsealed"])
def test_a_directory_export_did_not_mark_is_refused_untouched(work, tmp_path, capsys, case):
    """Only a directory with a sealed manifest of tdiff's is replaceable: a config.json holding 1, a notes
    file that mentions "tdiff_export", a manifest holding 1, a hand-made manifest (right hashes, no seal):
    exit 73 naming -o and why, the directory as it was, no temp folder left."""
    notes = {"notes.txt": "my notes: tdiff_export was here\n"}
    d = {"config-holds-1": lambda p: _user_dir(p, {"config.json": "1\n", **notes}),
         "marker-in-notes": lambda p: _user_dir(p, {"config.json": '{"tdiff_export": 1}\n', **notes}),
         "manifest-holds-1": lambda p: _user_dir(p, {"tdiff-manifest.json": "1\n", **notes}),
         "manifest-unsealed": lambda p: _user_dir(p, notes)}[case](tmp_path / "mine")
    if case == "manifest-unsealed":
        (d / "tdiff-manifest.json").write_text(_fake_manifest(d, seal="0" * 64))
    no_manifest = case in ("config-holds-1", "marker-in-notes")
    why = "no tdiff-manifest.json" if no_manifest else "is not one `tdiff export` wrote"
    before = _tree(d)
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", d])
    one_line_error(r, 73, f"-o {d}", why, "refusing to replace it")
    assert _tree(d) == before and (d / "notes.txt").read_text() == notes["notes.txt"]
    assert _temps(tmp_path) == []


def test_an_earlier_export_is_replaced_only_while_unchanged(work, tmp_path, capsys):
    """An export is replaced by the next; a user's file added to it, a file of it edited or removed:
    refused (73), the directory as it was."""
    out = tmp_path / "slim"
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", out, "-q"])
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "tdiff-manifest.json").read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors"}
    config = (out / "config.json").read_bytes()
    changes = [("notes.txt", b"mine\n", "did not write (notes.txt)"),
               ("config.json", config + b" ", "config.json changed since"),
               ("config.json", None, "files of the export are gone (config.json)")]
    for name, data, why in changes:
        if data is None:
            (out / name).unlink()
        else:
            (out / name).write_bytes(data)
        before = _tree(out)
        r = run_cli(["export", "-m", work / "model.safetensors", "-o", out, "--dtype", "bf16"])
        one_line_error(r, 73, f"-o {out}", why)
        assert _tree(out) == before
        (out / "notes.txt").unlink(missing_ok=True)
        (out / "config.json").write_bytes(config)
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", out, "--dtype", "bf16", "-q"])
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "config.json").read_text())["dtype"] == "bf16" and _temps(tmp_path) == []


def test_a_symlink_to_a_directory_stays_a_symlink(work, tmp_path, capsys):
    """-o LINK writes the link's target (here an empty directory) and keeps the link; a link to a user's
    directory or a dangling one is refused (73), link and directory as they were."""
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", link, "-q"])
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert {p.name for p in real.iterdir()} == {"config.json", "model.safetensors", "tdiff-manifest.json"}
    mine = _user_dir(tmp_path / "mine", {"notes.txt": "keep me\n"})
    link.unlink()
    link.symlink_to(mine)
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", link])
    one_line_error(r, 73, f"-o {link}", "not written by `tdiff export`")
    assert link.is_symlink() and os.readlink(link) == str(mine) and _tree(mine) == {"notes.txt": b"keep me\n"}
    link.unlink()
    link.symlink_to(tmp_path / "nowhere")
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", link])
    one_line_error(r, 73, f"{link}", "symlink")
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()
    assert _temps(tmp_path) == []


def test_temp_folders_of_killed_runs_are_removed(work, tmp_path, capsys):
    """A run killed with -9 leaves its temp folder (named with its pid); the next run removes those of
    processes that are gone and keeps a running one's. An empty directory is filled."""
    out = tmp_path / "out"
    out.mkdir()
    dead = tmp_path / f".out.{2**30}.k9x2ab.tmp"                  # no process has this pid (pid_max <= 2**22)
    (dead / "d").mkdir(parents=True)
    (dead / "denoiser.pt2").write_bytes(b"half written")
    alive = tmp_path / ".out.1.zz9.tmp"                            # pid 1 runs
    alive.mkdir()
    r = run_cli(["export", "-m", work / "model.safetensors", "-o", out, "-q"])
    assert r.returncode == 0, r.stderr
    assert _temps(tmp_path) == [alive.name]
    assert (out / "tdiff-manifest.json").is_file() and (out / "model.safetensors").is_file()
