"""`tdiff plot`: training curves from metrics logs and the quality–diversity frontier, as a user runs it."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

pytest.importorskip("matplotlib")


def _log(path, losses, start=1):
    with open(path, "w") as f:
        for i, loss in enumerate(losses):
            f.write(json.dumps({"step": start + i * 10, "loss": loss, "lr": 1e-3, "grad_norm": 0.5,
                                "tokens_per_s": 1000.0 + i, "elapsed_s": 2.0 * i}) + "\n")
    return path


def _png(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    return data


def test_curves_of_several_runs(tmp_path, work):
    a = _log(tmp_path / "a.jsonl", [3.0, 2.0, 1.5, 1.2])
    b = _log(tmp_path / "b.jsonl", [3.1, 2.2, 1.4])
    for x in ("step", "time"):
        out = tmp_path / f"c_{x}.png"
        r = run_cli(["plot", a, b, work / "dit.jsonl", "-o", out, "--x", x, "--title", "runs"])
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout == b"" and b"3 runs" in r.stderr
        _png(out)
    r = run_cli(["plot", a, "-o", tmp_path / "c.svg", "-q"])
    assert r.returncode == 0 and (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")


def test_frontier_file(tmp_path):
    res = {"real": {"judge_ppl": 200.0, "char_entropy": 6.3},
           "runs": [{"system": "tdiff_s0", "points": [{"knob": 0, "judge_ppl": 900.0, "char_entropy": 5.8},
                                                      {"knob": 1, "judge_ppl": 1500.0, "char_entropy": 6.2}]},
                    {"system": "ar", "points": [{"knob": 1.0, "judge_ppl": 300.0, "char_entropy": 6.1}]}]}
    f = tmp_path / "frontier.json"
    f.write_text(json.dumps(res))
    g = tmp_path / "other.json"
    g.write_text(json.dumps({**res, "runs": [{**res["runs"][0], "system": "tdiff_s1"}]}))
    r = run_cli(["plot", f, g, "-o", tmp_path / "f.png"])
    assert r.returncode == 0, r.stderr.decode()
    _png(tmp_path / "f.png")
    g.write_text(json.dumps({**res, "real": {"judge_ppl": 210.0, "char_entropy": 6.3}}))
    r = run_cli(["plot", f, g, "-o", tmp_path / "g.png"])
    assert r.returncode == 65 and b"another judge" in r.stderr and not (tmp_path / "g.png").exists()


def test_bad_inputs(tmp_path):
    good = _log(tmp_path / "a.jsonl", [1.0, 0.9])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "loss": 1.0}\n{"step": 2}\n')
    front = tmp_path / "f.json"
    front.write_text(json.dumps({"real": {}, "runs": []}))
    out = tmp_path / "o.png"
    out.write_bytes(b"keep")
    cases = [([bad], 65, "bad.jsonl:2"), ([tmp_path / "none.jsonl"], 66, "none.jsonl"),
             ([good, front], 2, "not both"), ([good, "-o", tmp_path / "x.gif"], 2, ".png")]
    for args, code, words in cases:
        if "-o" not in args:
            args = [*args, "-o", out]
        r = run_cli(["plot", *args])
        assert r.returncode == code, (args, r.stderr.decode())
        assert words in r.stderr.decode() and b"Traceback" not in r.stderr
    assert out.read_bytes() == b"keep"                                          # nothing half-written
    r = run_cli(["plot", good, "-o", out, "--x", "epoch"])
    assert r.returncode == 2


def test_missing_matplotlib_names_the_extra(tmp_path):
    good = _log(tmp_path / "a.jsonl", [1.0, 0.9])
    code = ("import sys; sys.modules['matplotlib'] = None; from tdiff.cli.main import main; "
            f"sys.argv = ['tdiff', 'plot', {str(good)!r}, '-o', {str(tmp_path / 'o.png')!r}]; main()")
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert r.returncode == 2 and b"pip install 'tdiff[plot]'" in r.stderr


def test_eval_every_logs_heldout_figures_without_changing_training(work, tmp_path):
    """--eval-every: held-out figures of the EMA weights in the log at those steps; the trained weights
    are those of a run without it (the evaluation swaps the EMA weights in and back, and every
    micro-batch reseeds its own random streams)."""
    from safetensors.torch import load_file

    def train(name, *extra):
        out = tmp_path / f"{name}.safetensors"
        r = run_cli(["train", "-i", work / "ids.jsonl", "--vae", work / "vae.safetensors", "-o", out,
                       "--max-steps", "4", "--batch-size", "8", "--warmup", "0", "--lr", "1e-3", "--log-every", "1",
                       "--log", tmp_path / f"{name}.jsonl",
                       "--preset", "tiny", "--device", "cpu", "-q", *extra])
        assert r.returncode == 0, r.stderr.decode()
        return out, [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]

    plain, plain_log = train("plain")
    watched, log = train("watched", "--eval-every", "2")
    assert [("heldout_loss" in r) for r in log] == [False, True, False, True]
    assert all(0 < r["heldout_loss"] < 10 for r in log if "heldout_loss" in r)
    assert [r["loss"] for r in log] == [r["loss"] for r in plain_log]
    a, b = load_file(str(plain)), load_file(str(watched))
    # the same weights: bit for bit in our runs; the tolerance is this VM's rare few-ulp wobble of the same
    # fp32 command (docs/RESULTS.md, "Determinism and exact resume"), far below what other random draws do (another --seed: 0.36)
    worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert worst <= 1e-6, worst
    out = tmp_path / "held.png"
    r = run_cli(["plot", tmp_path / "watched.jsonl", "-o", out, "-q"])
    assert r.returncode == 0 and out.stat().st_size > 10_000


# ---------------------------------------------------------------- hostile input, in process

from conftest import one_line_error  # noqa: E402

FRONTIER = {"real": {"judge_ppl": 200.0, "char_entropy": 6.3},
            "runs": [{"system": "tdiff_s0", "points": [{"knob": 0, "judge_ppl": 900.0, "char_entropy": 5.8}]}]}


def _with(path, value):
    """FRONTIER with the field at PATH (keys and list indices) set to VALUE, or removed for None."""
    res = json.loads(json.dumps(FRONTIER))
    *head, last = path
    node = res
    for k in head:
        node = node[k]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return res


@pytest.mark.parametrize("path,value,field", [
    (("real",), None, '"real" is missing'),
    (("real",), [1], '"real" must be an object'),
    (("real", "judge_ppl"), "x", '"real.judge_ppl" must be a positive number'),
    (("real", "judge_ppl"), -1, '"real.judge_ppl" must be a positive number'),
    (("real", "char_entropy"), None, '"real.char_entropy" is missing'),
    (("runs",), {"a": 1}, '"runs" must be a list'),
    (("runs", 0), "x", '"runs[0]" must be an object'),
    (("runs", 0, "system"), 3, '"runs[0].system" must be text'),
    (("runs", 0, "points"), None, '"runs[0].points" is missing'),
    (("runs", 0, "points", 0, "knob"), "top-p", '"runs[0].points[0].knob" must be a number'),
    (("runs", 0, "points", 0, "judge_ppl"), None, '"runs[0].points[0].judge_ppl" is missing'),
    (("runs", 0, "points", 0, "char_entropy"), True, '"runs[0].points[0].char_entropy" must be a number'),
    (("runs", 0, "points", 0, "char_entropy"), 1e308, '"runs[0].points[0].char_entropy" must be a number'),
    (("title",), 7, '"title" must be text'),
])
def test_frontier_fields_are_checked(tmp_path, capsys, path, value, field):
    """Every field the frontier figure reads, missing or of the wrong kind: exit 65 naming the file and
    the field, no figure; the good file beside it (merged) does not hide the bad one."""
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(FRONTIER))
    bad.write_text(json.dumps(_with(path, value)))
    out = tmp_path / "f.png"
    for files in ([bad], [good, bad]):
        r = run_cli(["plot", *files, "-o", out])
        one_line_error(r, 65, f"{bad}: field {field}")
    assert not out.exists()


@pytest.mark.parametrize("line,field", [
    ('{"step": 2}', 'no "loss" field'),
    ('{"loss": 1.0}', 'no "step" field'),
    ('{"step": true, "loss": 1.0}', '"step" must be an integer'),
    ('{"step": 2.5, "loss": 1.0}', '"step" must be an integer'),
    ('{"step": 2, "loss": "low"}', '"loss" must be a number'),
    ('{"step": 2, "loss": NaN}', '"loss" must be a number'),
    ('{"step": 2, "loss": 1.0, "lr": "1e-3"}', '"lr" must be a number'),
    ('{"step": 2, "loss": 1.0, "grad_norm": Infinity}', '"grad_norm" must be a number'),
    ('{"step": 2, "loss": 1.0, "tokens_per_s": null}', '"tokens_per_s" must be a number'),
    ('{"step": 2, "loss": 1.0, "elapsed_s": [1]}', '"elapsed_s" must be a number'),
    ('{"step": 2, "loss": 1.0, "heldout_loss": "n/a"}', '"heldout_loss" must be a number'),
    ('{"step": 2, "loss": 1e-320}', '"loss" must be a number'),
])
def test_metrics_log_fields_are_checked(tmp_path, capsys, line, field):
    """Every field the curves read: exit 65 naming FILE:LINE and the field; nothing written."""
    log = tmp_path / "run.jsonl"
    log.write_text('{"step": 1, "loss": 2.0, "lr": 0.001, "phase": "warm-up"}\n' + line + "\n")
    out = tmp_path / "c.png"
    r = run_cli(["plot", log, "-o", out])
    one_line_error(r, 65, f"{log}:2: ", field)
    assert not out.exists()


def test_dump_config_round_trips_with_the_inputs(tmp_path, capsys, monkeypatch):
    """--dump-config prints YAML (the inputs under `files`) that --config reads back: the same figure."""
    import yaml

    monkeypatch.chdir(tmp_path)
    _log(tmp_path / "a.jsonl", [3.0, 2.0, 1.5])
    _log(tmp_path / "b.jsonl", [3.1, 2.2])
    r = run_cli(["plot", "a.jsonl", "b.jsonl", "-o", "c.svg", "--x", "time", "--title", "two", "--dump-config"])
    assert r.returncode == 0 and b"Traceback" not in r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert cfg["files"] == ["a.jsonl", "b.jsonl"] and cfg["output"] == "c.svg" and cfg["x"] == "time"
    assert not (tmp_path / "c.svg").exists()                                  # --dump-config draws nothing
    (tmp_path / "cfg.yaml").write_text(r.stdout.decode())
    r = run_cli(["plot", "--config", "cfg.yaml"])
    assert r.returncode == 0, r.stderr
    assert b"2 runs" in r.stderr and (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")


def test_config_gives_the_inputs(tmp_path, capsys, monkeypatch):
    """`files` in a --config file: a list or one path; the command line's files win; a key of another
    kind is a usage error naming the file and the key."""
    monkeypatch.chdir(tmp_path)
    _log(tmp_path / "a.jsonl", [3.0, 2.0])
    (tmp_path / "bad.jsonl").write_text("not json\n")
    (tmp_path / "one.yaml").write_text("files: a.jsonl\noutput: one.png\n")
    r = run_cli(["plot", "--config", "one.yaml", "-q"])
    assert r.returncode == 0, r.stderr
    _png(tmp_path / "one.png")
    (tmp_path / "list.yaml").write_text("files: [bad.jsonl]\noutput: two.png\n")
    r = run_cli(["plot", "--config", "list.yaml"])
    one_line_error(r, 65, "bad.jsonl:1")
    r = run_cli(["plot", "a.jsonl", "--config", "list.yaml", "-q"])   # the command line wins
    assert r.returncode == 0, r.stderr
    _png(tmp_path / "two.png")
    (tmp_path / "odd.yaml").write_text("files: [1, null]\noutput: three.png\n")
    r = run_cli(["plot", "--config", "odd.yaml"])
    one_line_error(r, 2, "odd.yaml", "'files' must be a list of paths")
    assert not (tmp_path / "three.png").exists()
