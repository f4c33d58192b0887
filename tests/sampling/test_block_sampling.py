"""`tdiff train --block-size` and block-by-block sampling with every control option that applies."""

import json

import pytest
import torch

from conftest import TINY, one_line_error, run_cli


@pytest.fixture(scope="module")
def block_model(work, tmp_path_factory):
    out = tmp_path_factory.mktemp("block") / "model.safetensors"
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", out, "--block-size", "4",
                 "--max-steps", "30", "--batch-size", "16", *TINY])
    assert r.returncode == 0, r.stderr.decode()
    return out


def _records(r):
    assert r.returncode == 0, r.stderr.decode()
    return [json.loads(line) for line in r.stdout.decode().splitlines()]


def test_block_size_is_stored_and_shown(block_model):
    from tdiff.formats.model import load_model

    b = load_model(block_model)
    assert b.dit.config.block_size == 4 and b.dit.config.block_causal
    info = json.loads(run_cli(["info", block_model]).stdout)
    assert info["denoiser"]["block_size"] == 4


def test_samples_are_seeded_and_keep_prompt_and_length(block_model):
    plain = _records(run_cli(["sample", "-m", block_model, "-n", "4", "--steps", "3", "--seed", "5"]))
    again = _records(run_cli(["sample", "-m", block_model, "-n", "4", "--steps", "3", "--seed", "5"]))
    assert plain == again and len(plain) == 4 and all(r["ids"] for r in plain)
    prompted = _records(run_cli(["sample", "-m", block_model, "-n", "3", "--steps", "3", "--prompt", "春风"]))
    assert all(r["text"].startswith("春风") for r in prompted)
    fixed = _records(run_cli(["sample", "-m", block_model, "-n", "3", "--steps", "3", "--length", "6"]))
    assert all(len(r["ids"]) == 6 for r in fixed)
    for solver in ("ddim", "ddpm"):
        assert len(_records(run_cli(["sample", "-m", block_model, "-n", "2", "--steps", "2", "--solver", solver]))) == 2


def test_given_blocks_are_not_sampled(block_model):
    """Blocks whose latents are all known skip the solver: 3 steps × (22 − 2) blocks of calls."""
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import SampleOptions, sample_latents

    b = load_model(block_model)
    n, d = b.latent_shape
    calls = []
    cond_x = torch.randn(2, n, d)
    cond_mask = torch.zeros(2, n, 1)
    cond_mask[:, :8] = 1                                                # the first two blocks of 4
    z = sample_latents(b, 2, SampleOptions(steps=3), torch.Generator().manual_seed(0), torch.device("cpu"),
                       callback=lambda *a: calls.append(a[0]), cond_x=cond_x, cond_mask=cond_mask)
    assert len(calls) == 3 * (-(-n // 4) - 2)
    assert torch.equal(z[:, :8], cond_x[:, :8])


def test_what_block_models_refuse(block_model, work, tmp_path):
    r = run_cli(["sample", "-m", block_model, "-n", "1", "--round-x0"])
    one_line_error(r, 2, "--round-x0", "block-causal")
    r = run_cli(["export", "-m", block_model, "-o", tmp_path / "ex", "--format", "torchscript"])
    one_line_error(r, 2, "--format torchscript", "block-causal")
    r = run_cli(["distill", "-i", work / "ids.jsonl", "-m", block_model, "-o", tmp_path / "s.safetensors",
                 "--max-steps", "2", "--device", "cpu", "--quiet"])
    one_line_error(r, 2, "block-causal")
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", tmp_path / "m.safetensors",
                 "--block-size", "-1"])
    assert r.returncode == 2 and b"--block-size" in r.stderr


def test_eval_measures_a_block_model(block_model, work):
    r = run_cli(["eval", "-m", block_model, "--data", work / "ids.jsonl", "--t-samples", "1", "--max-records", "32", "-q"])
    assert r.returncode == 0, r.stderr.decode()
    by_t = json.loads(r.stdout)["noise_levels"]["by_t"]
    assert all(0 <= v["denoiser_accuracy"] <= 1 for v in by_t.values())
