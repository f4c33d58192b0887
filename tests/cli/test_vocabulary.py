"""One command-line vocabulary (issue 24, item 5): one name per concept, one meaning per name, one
default per option across commands. Options renamed to get there keep their old spelling, hidden
from --help, for one release: it works, with one warning line; both spellings at once are a usage
error. The ranges --help shows are the ranges accepted."""

import re

import pytest
import typer.main
import yaml

from tdiff.cli.commands.registry import COMMANDS
from tdiff.cli.main import app
from conftest import one_line_error, run_cli

NOTE = "the old spelling goes in the next release"

# (command, the options it needs to reach --dump-config)
NEED = {"train-ar": ["-i", "ids.jsonl", "-t", "tok.model", "-o", "ar"],
        "train-vae": ["-i", "ids.jsonl", "-t", "tok.model", "-o", "v.safetensors"],
        "train": ["-i", "ids.jsonl", "--vae", "v.safetensors", "-o", "m.safetensors"],
        "distill": ["-i", "ids.jsonl", "-m", "m.safetensors", "-o", "s.safetensors"],
        "eval": ["-m", "m.safetensors", "--speed"],
        "sample": ["-m", "m.safetensors"],
        "tokenize": []}

# (command, old flags, new flags, value, new config key, old config key)
RENAMED = [
    ("train-ar", "--n-embd", "--d-model", "32", "d_model", "n_embd"),
    ("train-ar", "--n-layer", "--n-layers", "2", "n_layers", "n_layer"),
    ("train-ar", "--n-head", "--n-heads", "4", "n_heads", "n_head"),
    ("train-ar", "--ema", "--ema-decay", "0.9", "ema_decay", "ema"),
    ("train-vae", "--ema", "--ema-decay", "0.9", "ema_decay", "ema"),
    ("train", "--ema", "--ema-decay", "0.5", "ema_decay", "ema"),
    ("distill", "--ema", "--ema-decay", "0.99", "ema_decay", "ema"),
    ("eval", "--warmup", "--warmup-batches", "3", "warmup_batches", "warmup"),
    ("tokenize", "-m/--model", "-t/--tokenizer", "tok.model", "tokenizer", "model"),
]
IDS = [f"{c} {o}" for c, o, *_ in RENAMED]


def _dump(r) -> dict:
    assert r.returncode == 0, r.stderr.decode()
    return yaml.safe_load(r.stdout)


def _warnings(r) -> list:
    return [ln for ln in r.stderr.decode().splitlines() if ln.strip()]


def _value(text: str):
    return yaml.safe_load(text)


@pytest.mark.parametrize("cmd,old,new,value,key,old_key", RENAMED, ids=IDS)
def test_old_spelling_works_with_one_warning(cmd, old, new, value, key, old_key, capsys):
    for spelling in old.split("/"):
        r = run_cli([cmd, *NEED[cmd], spelling, value, "--dump-config"])
        d = _dump(r)
        assert d[key] == _value(value) and old_key not in d           # --dump-config names the new option
        assert _warnings(r) == [f"tdiff: warning: {old} is now {new}; {NOTE}"]


@pytest.mark.parametrize("cmd,old,new,value,key,old_key", RENAMED, ids=IDS)
def test_both_spellings_are_a_usage_error(cmd, old, new, value, key, old_key, capsys):
    r = run_cli([cmd, *NEED[cmd], old.split("/")[-1], value, new.split("/")[-1], value, "--dump-config"])
    one_line_error(r, 2, old, new, "give it once")
    assert r.stdout == b""


@pytest.mark.parametrize("cmd,old,new,value,key,old_key", RENAMED, ids=IDS)
def test_old_config_key_works_and_both_keys_are_refused(cmd, old, new, value, key, old_key, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"{old_key}: {value}\n")
    r = run_cli([cmd, *NEED[cmd], "--config", cfg, "--dump-config"])
    d = _dump(r)
    assert d[key] == _value(value) and old_key not in d
    assert _warnings(r) == [f"tdiff: warning: --config key '{old_key}' is now '{key}'; {NOTE}"]
    again = tmp_path / "again.yaml"                    # what --dump-config printed reads back, silently
    again.write_text(r.stdout.decode())
    r = run_cli([cmd, *NEED[cmd], "--config", again, "--dump-config"])
    assert _dump(r) == d and _warnings(r) == []
    cfg.write_text(f"{old_key}: {value}\n{key}: {value}\n")
    r = run_cli([cmd, *NEED[cmd], "--config", cfg, "--dump-config"])
    one_line_error(r, 2, "--config", key, old_key)


def test_command_line_beats_an_old_config_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("n_embd: 48\n")
    r = run_cli(["train-ar", *NEED["train-ar"], "--config", cfg, "--d-model", "64", "--dump-config"])
    assert _dump(r)["d_model"] == 64


def test_old_tokenize_spelling_gives_the_same_ids(work, tmp_path, capsys):
    """The alias reaches the command, not only --dump-config: -m and -t encode alike."""
    text = tmp_path / "text.jsonl"
    text.write_text('{"text": "床前明月光"}\n{"text": "疑是地上霜"}\n', encoding="utf-8")
    new = run_cli(["tokenize", "-t", work / "tok.model", "-i", text, "-q"])
    old = run_cli(["tokenize", "-m", work / "tok.model", "-i", text, "-q"])
    assert new.returncode == old.returncode == 0 and new.stdout == old.stdout and new.stdout.count(b"\n") == 2
    assert _warnings(old) == [f"tdiff: warning: -m/--model is now -t/--tokenizer; {NOTE}"]


# ---------------------------------------------------------------- --help: the one vocabulary

OLD_FLAGS = ("--n-embd", "--n-layer", "--n-head", "--ema", "--warmup")


def _help(name: str, capsys) -> str:
    r = run_cli([name, "--help"])
    assert r.returncode == 0
    return r.stdout.decode()


@pytest.mark.parametrize("name", [n for n, _ in COMMANDS])
def test_help_shows_no_old_spelling(name, capsys):
    out = _help(name, capsys)
    shown = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", out))
    assert not shown & set(OLD_FLAGS) - ({"--warmup"} if name in ("train-vae", "train", "train-ar", "distill")
                                         else set()), out
    if name == "tokenize":
        assert "--model " not in out and "-m," not in out and "-t, --tokenizer" in out


def _visible(name: str) -> list:
    cmd = typer.main.get_command(app).commands[name]
    return [p for p in cmd.params if not p.hidden and getattr(p, "opts", None) and p.opts[0].startswith("-")]


def test_one_name_per_concept_and_one_meaning_per_name():
    """A short flag is the same long flag everywhere; a long flag is the same parameter everywhere; the
    sizes of a network and the tokenizer file have one spelling in every command that takes them."""
    short, param = {}, {}
    for name, _ in COMMANDS:
        for p in _visible(name):
            longs = [o for o in p.opts if o.startswith("--")]
            for o in p.opts:
                if not o.startswith("--"):
                    short.setdefault(o, set()).update(longs)
            for o in longs:
                param.setdefault(o, set()).add(p.name)
    assert {s: l for s, l in short.items() if len(l) > 1} == {}
    assert {o: n for o, n in param.items() if len(n) > 1} == {}
    assert short["-m"] == {"--model"} and short["-t"] == {"--tokenizer"}
    for name in ("train-vae", "train", "train-ar"):
        flags = {o for p in _visible(name) for o in p.opts}
        assert {"--d-model", "--n-layers"} <= flags, name
    for name in ("tokenize", "train-vae", "train-ar"):
        assert {"-t", "--tokenizer"} <= {o for p in _visible(name) for o in p.opts}, name


def test_one_default_per_option_where_a_model_runs():
    """sample and eval run a trained model: the same --dtype (auto), --device and --seed defaults, and
    both offer --no-ema."""
    by = {name: {p.name: p for p in _visible(name)} for name in ("sample", "eval")}
    for opt in ("dtype", "device", "seed", "no_ema", "compile"):
        assert by["sample"][opt].default == by["eval"][opt].default, opt
    assert by["eval"]["dtype"].default == "auto"


def test_jobs_only_where_work_runs_in_workers():
    """-j/--jobs is offered where tdiff.core.workers runs the work (tokenize), nowhere it would do nothing."""
    has = [name for name, _ in COMMANDS if any(p.name == "jobs" for p in _visible(name))]
    assert has == ["tokenize"]


# ---------------------------------------------------------------- ranges: shown = accepted

# (command, option, refused, accepted, what --help shows)
BOUNDS = [
    ("sample", "--top-p", "0", "1e-6", "0.0<x<=1.0"),
    ("sample", "--top-p", "1.0001", "1", "0.0<x<=1.0"),
    ("train-vae", "--latent-stride", "3", "4", "<1|2|4>"),
    ("tokenize", "--vocab-size", "260", "261", "261<=x<=1000000"),
    ("tokenize", "--character-coverage", "0.97", "0.98", "0.98<=x<=1.0"),
    ("train-ar", "--max-len", "1025", "1024", "0<=x<=1024"),
    ("train-ar", "--d-model", "4097", "4096", "0<=x<=4096"),
    ("eval", "--warmup-batches", "-1", "0", "0<=x<=100000"),
]


@pytest.mark.parametrize("cmd,opt,bad,good,shown", BOUNDS, ids=[f"{c} {o} {b}" for c, o, b, *_ in BOUNDS])
def test_help_range_is_the_accepted_range(cmd, opt, bad, good, shown, capsys):
    assert shown in re.sub(r"\s+", "", _help(cmd, capsys).split(opt, 1)[1].split("\n  -", 1)[0])
    r = run_cli([cmd, *NEED[cmd], opt, bad, "--dump-config"])
    one_line_error(r, 2, opt)
    r = run_cli([cmd, *NEED[cmd], opt, good, "--dump-config"])
    assert r.returncode == 0, r.stderr.decode()


def test_the_library_accepts_the_ends_that_help_shows():
    """The ends of the ranges above are the library's own checks (sampler, tokenizer trainer, GPT-2 sizes)."""
    from tdiff.core.errors import UsageError
    from tdiff.models.ar import MAX_POSITIONS, make_config
    from tdiff.sampling.sample import SampleOptions, check_options
    from tdiff.text.tokenizer_train import MIN_COVERAGE

    check_options(SampleOptions(top_p=1e-6))
    check_options(SampleOptions(top_p=1.0))
    with pytest.raises(UsageError, match="--top-p"):
        check_options(SampleOptions(top_p=0.0))
    params = {p.name: p for p in _visible("tokenize")}
    assert params["character_coverage"].min == MIN_COVERAGE
    assert {p.name: p for p in _visible("train-ar")}["max_len"].max == MAX_POSITIONS
    make_config(100, MAX_POSITIONS, "tiny", n_layer=1, n_embd=32, n_head=2)
    with pytest.raises(UsageError, match="--d-model 30 must be a multiple of --n-heads 4"):
        make_config(100, 16, "tiny", n_layer=1, n_embd=30, n_head=4)


def test_sample_promises_no_time_field():
    """Records stay byte-for-byte reproducible: what sample promises is what it writes, no timing."""
    from tdiff.cli.commands.sample import sample

    assert "time)" not in sample.__doc__ and "no timing" in sample.__doc__
