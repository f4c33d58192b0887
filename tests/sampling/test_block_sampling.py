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


def test_given_blocks_are_not_sampled(block_model, monkeypatch):
    """Blocks whose latents are all known skip the solver: 3 steps × (22 − 2) blocks of calls (the
    texts made never to end, so that every block is sampled)."""
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import SampleOptions, sample_latents

    _never_ends(monkeypatch)
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


def _never_ends(monkeypatch):
    import tdiff.sampling.sample as S

    monkeypatch.setattr(S, "ended_rows", lambda bundle, z, s, e, must=None: torch.zeros(z.shape[0], dtype=torch.bool))


def test_max_tokens_slides_past_the_window(block_model, monkeypatch):
    """Past the window the frame slides by half a window: the cache is rebuilt from the frame's first
    latents block by block (positions 0, 4, …), the next block sits after them, and the first window
    is the one sampled without --max-tokens."""
    from tdiff.formats.model import load_model
    from tdiff.sampling.sample import SampleOptions, sample_latents, slide_keep

    _never_ends(monkeypatch)
    b = load_model(block_model)
    n, d = b.latent_shape
    k = b.vae.config.latent_stride
    keep = slide_keep(n, 4)
    assert keep == (n // 2) // 4 * 4 and slide_keep(8, 8) == 8 and slide_keep(64, 16) == 32
    starts, calls = [], []
    extend = b.dit.extend_cache
    given = []
    monkeypatch.setattr(b.dit, "extend_cache", lambda x0, s, cache, label=None: (
        starts.append(s), given.append(x0), extend(x0, s, cache, label=label))[2])
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    cpu = torch.device("cpu")
    window = sample_latents(b, 2, SampleOptions(steps=2), g(), cpu)
    starts.clear()
    given.clear()
    total = n + 4 + 2                                                  # latents: one whole block and a half one
    z = sample_latents(b, 2, SampleOptions(steps=2, max_tokens=total * k), g(), cpu,
                       callback=lambda *a: calls.append(a[0]))
    assert z.shape == (2, total, d)
    assert torch.equal(z[:, :n], window)
    blocks = -(-n // 4) + 2
    assert len(calls) == 2 * blocks
    first = list(range(0, n, 4))                                       # the first window's blocks
    rebuilt = list(range(0, keep, 4))                                  # the slide: the kept context, block by block
    assert starts == first + rebuilt + [keep]
    context = torch.cat(given[len(first):len(first) + len(rebuilt)], dim=1)
    assert torch.equal(context, z[:, n - keep:n])                      # the frame's context: the window's last latents


def test_sampling_stops_when_every_text_has_ended(block_model, monkeypatch):
    import tdiff.api
    import tdiff.sampling.sample as S

    seen = []
    monkeypatch.setattr(S, "ended_rows", lambda bundle, z, s, e, must=None: (
        seen.append((s, e)), torch.ones(z.shape[0], dtype=torch.bool))[1])
    m = tdiff.api.load(block_model)
    recs = list(m.generate(3, steps=2, seed=1))
    assert seen == [(0, 4)]                                             # checked after the first block, then stopped
    k = m.bundle.vae.config.latent_stride
    assert all(1 <= len(r["ids"]) <= 4 * k for r in recs)
    rows = []

    def first_row_then_all(bundle, z, s, e, must=None):
        rows.append(z.shape[0])
        done = torch.ones(z.shape[0], dtype=torch.bool)
        if len(rows) == 1:
            done[1:] = False
        return done

    monkeypatch.setattr(S, "ended_rows", first_row_then_all)
    assert len(list(m.generate(3, steps=2, batch_size=3))) == 3
    assert rows == [3, 2]                                              # an ended row is not read again
    monkeypatch.setattr(S, "ended_rows", lambda bundle, z, s, e, must=None: (
        seen.append((s, e)), torch.ones(z.shape[0], dtype=torch.bool))[1])
    seen.clear()
    fixed = list(m.generate(2, steps=2, length=10))                    # the given pads lie ahead: no early stop
    assert all(len(r["ids"]) == 10 for r in fixed) and not seen


def test_the_end_of_text_rule():
    """`ended_rows` reads a run of three pads in the block or reaching into it, never where a pad is
    barred (MUST), and looks at END_CONTEXT latents before the block only."""
    from types import SimpleNamespace

    from tdiff.sampling.sample import END_CONTEXT, ended_rows

    pad, V, k = 0, 5, 2

    class Vae:
        config = SimpleNamespace(latent_stride=k)

        def denormalize(self, z):
            return z

        def decode_hidden(self, z):                                   # latent (B, N, 2) holds two token ids
            self.seen = z.shape[1]
            return torch.nn.functional.one_hot(z.long().reshape(z.shape[0], -1), V).float()   # (B, N·k, V)

        lm_head = torch.nn.Linear(V, V, bias=False)                  # the identity: a one-hot state is its id
        torch.nn.init.eye_(lm_head.weight)

    vae = Vae()
    bundle = SimpleNamespace(vae=vae, tokenizer=SimpleNamespace(pad_id=pad, bos_id=1, eos_id=2))
    rows = [[3, 3, 3, 3, 3, 0, 0, 0],      # pads inside the block of latents 2…4 (tokens 4…7)
            [3, 3, 3, 0, 0, 3, 3, 3],      # a run of two: not an end
            [3, 3, 3, 0, 0, 0, 4, 4],      # a run that starts before the block (token 3) and reaches into it
            [0, 0, 0, 3, 3, 3, 3, 3]]      # a run wholly before the block: not this block's end
    z = torch.tensor(rows, dtype=torch.float).reshape(4, 4, k)         # (B, N, C)
    assert ended_rows(bundle, z, 2, 4).tolist() == [True, False, True, False]
    must = torch.zeros(4, 8, dtype=torch.bool)
    must[0, 6:] = True                                                 # barred pads: row 0 reads text there
    assert ended_rows(bundle, z, 2, 4, must).tolist() == [False, False, True, False]
    long = torch.full((1, END_CONTEXT + 8, k), 3.0)
    ended_rows(bundle, long, END_CONTEXT + 4, END_CONTEXT + 8)
    assert vae.seen == END_CONTEXT + 4                                 # the block and END_CONTEXT latents before it


def test_max_tokens_on_the_command_line(block_model, work):
    recs = _records(run_cli(["sample", "-m", block_model, "-n", "2", "--steps", "2", "--max-tokens", "300"]))
    assert len(recs) == 2 and all(1 <= len(r["ids"]) <= 300 for r in recs)
    r = run_cli(["sample", "-m", work / "model.safetensors", "-n", "1", "--max-tokens", "300"])
    one_line_error(r, 2, "--max-tokens", "block-causal")
    r = run_cli(["sample", "-m", block_model, "-n", "1", "--max-tokens", "300", "--segments", "2"])
    one_line_error(r, 2, "--max-tokens", "--segments")
    r = run_cli(["sample", "-m", block_model, "-n", "1", "--max-tokens", "-1"])
    assert r.returncode == 2 and b"--max-tokens" in r.stderr
    r = run_cli(["sample", "-m", block_model, "-n", "60000", "--batch-size", "60000", "--max-tokens", "100000"])
    one_line_error(r, 2, "--max-tokens 100000", "the sampled latents")       # refused before any work
