"""bench/quality/ar_minutes.py: the AR-equivalent minutes and compute multiplier on hand-made numbers, and
--merge re-tabulating hand-written results into the JSON, the markdown table and a PNG, without sampling."""

from __future__ import annotations

import json
import math
import sys

import pytest

from bench.quality.ar_minutes import ar_curve, at_most, equivalent_minutes, main, seed_figures

CURVE = [(1.0, 1000.0), (2.0, 500.0), (4.0, 250.0)]          # PPL = 1000 / minutes: a line in log–log
CURVE_DICT = {"minutes": [m for m, _ in CURVE], "ppl": [p for _, p in CURVE]}


# ---------------------------------------------------------------------------
# the curve


def test_equivalent_minutes_is_log_log_linear_between_budgets():
    minutes, bound = equivalent_minutes(CURVE, 354.0)
    assert minutes == pytest.approx(1000 / 354, rel=1e-12) and bound is None       # ≈ 2.82 min
    assert equivalent_minutes(CURVE, 500.0) == (pytest.approx(2.0), None)
    assert equivalent_minutes(CURVE, 1000.0) == (1.0, None)
    assert equivalent_minutes(CURVE, 250.0) == (pytest.approx(4.0), None)
    # 700 between 1 and 2 min: ln m = ln 2 · ln(1000/700) / ln 2
    assert equivalent_minutes(CURVE, 700.0)[0] == pytest.approx(1000 / 700, rel=1e-12)


def test_equivalent_minutes_outside_the_ladder_is_a_bound():
    assert equivalent_minutes(CURVE, 1200.0) == (None, ("<", 1.0))    # worse than the smallest budget
    assert equivalent_minutes(CURVE, 200.0) == (None, (">", 4.0))     # better than the largest
    assert equivalent_minutes([(20.0, 300.0)], 200.0) == (None, (">", 20.0))


def test_equivalent_minutes_is_where_the_curve_first_reaches_the_ppl():
    # a noisy ladder rises again at 4 min: 500 is first reached between 1 and 2 min
    noisy = [(1.0, 1000.0), (2.0, 400.0), (4.0, 600.0), (8.0, 300.0)]
    w = math.log(1000 / 500) / math.log(1000 / 400)
    assert equivalent_minutes(noisy, 500.0)[0] == pytest.approx(2 ** w, rel=1e-12)
    assert 1.6 < 2 ** w < 1.8


def test_seed_figures_multiplier_and_equal_minutes_ratio():
    s = seed_figures(354.0, CURVE_DICT, 20.0)
    assert s["multiplier"]["value"] == pytest.approx(20 / (1000 / 354)) == pytest.approx(7.08)
    assert s["equal_minutes_ratio"] is None                          # no 20 min budget in this ladder
    s = seed_figures(354.0, CURVE_DICT, 4.0)
    assert s["multiplier"]["value"] == pytest.approx(4 * 354 / 1000)
    assert s["equal_minutes_ratio"] == pytest.approx(354 / 250)
    worse = seed_figures(1200.0, CURVE_DICT, 20.0)
    assert (worse["ar_equivalent_minutes"], worse["ar_equivalent_bound"]) == (None, "< 1")
    assert worse["multiplier"] == {"value": None, "bound": "> 20", "range": [20.0, None]}
    better = seed_figures(200.0, CURVE_DICT, 20.0)
    assert better["ar_equivalent_bound"] == "> 4"
    assert better["multiplier"] == {"value": None, "bound": "< 5", "range": [0.0, 5.0]}
    unknown = seed_figures(None, CURVE_DICT, 20.0)                   # the sweep did not bracket the real entropy
    assert unknown["multiplier"]["value"] is None and unknown["ar_equivalent_bound"] is None


def test_at_most_decides_on_the_mean_or_leaves_it_open():
    assert at_most([[3.0, 3.0], [5.0, 5.0]], 4.0) == {"pass": True, "value": 4.0, "range": [4.0, 4.0]}
    assert at_most([[3.0, 3.0], [5.0, 5.0]], 2.0)["pass"] is False
    assert at_most([[20.0, None], [3.0, 3.0]], 4.0)["pass"] is False          # mean > 11.5
    assert at_most([[4.0, None]], 4.0)["pass"] is False                       # strictly above 4
    assert at_most([[0.0, 5.0], [3.0, 3.0]], 4.0)["pass"] is True             # mean < 4
    assert at_most([[0.0, 5.0], [3.0, 3.0]], 3.0)["pass"] is None             # mean in [1.5, 4]: open
    assert at_most([], 4.0)["pass"] is None


def test_ar_curve_is_the_seed_mean_of_ln_ppl():
    runs = [{"ladder": "s0", "minutes": 1.0, "ppl_at_real_entropy": 800.0},
            {"ladder": "s1", "minutes": 1.0, "ppl_at_real_entropy": 1250.0},
            {"ladder": "s0", "minutes": 2.0, "ppl_at_real_entropy": None},
            {"ladder": "s1", "minutes": 2.0, "ppl_at_real_entropy": 500.0},
            {"ladder": "s0", "minutes": 4.0, "ppl_at_real_entropy": None}]
    c = ar_curve(runs)
    assert c["minutes"] == [1.0, 2.0] and c["seeds"] == [2, 1]          # 4 min: no seed brackets the entropy
    assert c["ppl"] == [pytest.approx(1000.0), 500.0]
    assert c["per_seed"]["s0"] == [[1.0, 800.0], [2.0, None], [4.0, None]]


# ---------------------------------------------------------------------------
# --merge on hand-written results

REAL = {"judge_ppl": 90.0, "char_entropy": 5.0, "mean_chars": 50.0, "empty": 0, "replacement_char": 0}


def _run(role: str, system: str, path: str, ppl: float, chars: float = 50.0, empty: int = 0, **extra) -> dict:
    """A scored run whose two knob points bracket the real entropy 5.0 symmetrically, so its PPL there is PPL."""
    points = [{"knob": 0.7, "judge_ppl": ppl * 0.8, "char_entropy": 4.5, "mean_chars": chars, "empty": empty,
               "replacement_char": 0},
              {"knob": 1.0, "judge_ppl": ppl * 1.25, "char_entropy": 5.5, "mean_chars": chars, "empty": 0,
               "replacement_char": 0}]
    return {"system": system, "path": path, "kind": "ar" if role == "ladder" else "tdiff", "points": points,
            "ppl_at_real_entropy": ppl, "q_at_real_entropy": 0.5, "role": role, **extra}


def _ladder(seed: str, ppls: dict) -> list[dict]:
    return [_run("ladder", f"AR {m:g} min", f"{seed}/ar_{m:g}min/ar", p, ladder=seed, minutes=m)
            for m, p in ppls.items()]


@pytest.fixture
def saved(tmp_path):
    """a.json: two AR ladders (seed-mean 1000 / 500 / 250 at 1 / 2 / 4 min); b.json: two systems."""
    base = {"judge": "judge", "real_path": "held.jsonl", "num": 16, "seed": 0, "minutes": 4.0, "real": REAL,
            "shuffled": {**REAL, "judge_ppl": 900.0}}
    speed = {"dtype": "fp32", "batch_1": {"tokens_per_s": 1234.4}, "batch_64": {"tokens_per_s": 56789.0}}
    a = {**base, "runs": _ladder("s0", {1.0: 800.0, 2.0: 400.0, 4.0: 250.0})
         + _ladder("s1", {1.0: 1250.0, 2.0: 625.0, 4.0: 250.0})}
    b = {**base, "runs": [_run("system", "tdiff", "t0.safetensors", 354.0, chars=48.0, train_minutes=4.0, speed=speed),
                          _run("system", "tdiff", "t1.safetensors", 500.0, chars=52.0, train_minutes=4.0),
                          _run("system", "b4ctx", "b0.safetensors", 1200.0, chars=40.0, empty=1, train_minutes=4.0)]}
    paths = tmp_path / "a.json", tmp_path / "b.json"
    for p, r in zip(paths, (a, b)):
        p.write_text(json.dumps(r))
    return paths


def _main(monkeypatch, capsys, *args) -> tuple[dict, str]:
    monkeypatch.setattr(sys, "argv", ["ar_minutes", *map(str, args)])
    main()
    out, err = capsys.readouterr()
    return json.loads(out), err


def test_merge_tabulates_and_plots_without_sampling(saved, tmp_path, monkeypatch, capsys):
    png = tmp_path / "both.png"
    r, err = _main(monkeypatch, capsys, "--merge", *saved, "--plot", png)
    assert r["ar_curve"]["minutes"] == [1.0, 2.0, 4.0]
    assert r["ar_curve"]["ppl"] == [pytest.approx(1000.0), pytest.approx(500.0), 250.0]
    t = r["systems"]["tdiff"]
    assert [s["ar_equivalent_minutes"] for s in t["per_seed"]] == [pytest.approx(1000 / 354), pytest.approx(2.0)]
    mult = [4 * 354 / 1000, 2.0]
    assert t["multiplier"] == {"mean": round(sum(mult) / 2, 4), "min": round(mult[0], 4), "max": 2.0, "n": 2}
    assert t["equal_minutes_ratio"]["mean"] == pytest.approx((354 / 250 + 2) / 2, abs=1e-4)
    assert t["speed"]["batch_64"]["tokens_per_s"] == 56789.0
    assert {k: v["pass"] for k, v in t["bars"].items()} == {
        "multiplier_le_4": True, "multiplier_le_2_goal": True, "equal_minutes_ratio_le_2.5": True,
        "length_within_10pct": True, "no_empty": True, "no_replacement_char": True}
    assert t["knobs"][0] == {"knob": 0.7, "judge_ppl": pytest.approx((354 + 500) / 2 * 0.8), "char_entropy": 4.5,
                             "length_ratio": 1.0, "empty": 0, "replacement_char": 0, "seeds": 2}
    b = r["systems"]["b4ctx"]
    assert b["per_seed"][0]["ar_equivalent_bound"] == "< 1" and b["per_seed"][0]["multiplier"]["bound"] == "> 4"
    assert {k: v["pass"] for k, v in b["bars"].items()} == {
        "multiplier_le_4": False, "multiplier_le_2_goal": False, "equal_minutes_ratio_le_2.5": False,
        "length_within_10pct": False, "no_empty": False, "no_replacement_char": True}
    assert b["bars"]["length_within_10pct"]["value"] == 0.8 and b["bars"]["no_empty"]["value"] == 1
    rows = {line.split("|")[1].strip(): line for line in err.splitlines() if line.startswith("| ")}
    assert rows["tdiff"] == "| tdiff | 2 | 427.0 (354.0–500.0) | 2.41 (2.00–2.82) | 1.71 (1.42–2.00) | " \
                            "1.71 (1.42–2.00) | 1234 | 56789 |"
    assert "| < 1 | > 4 | 4.80 |" in rows["b4ctx"]
    assert rows["AR 1 min"].startswith("| AR 1 min | 2 | 1000.0 (800.0–1250.0) | 1 | – | – | – | – |")
    assert rows["AR 4 min"].startswith("| AR 4 min | 2 | 250.0 | 4 |")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_merge_keeps_a_run_given_twice_once_and_takes_minutes(saved, monkeypatch, capsys):
    r, err = _main(monkeypatch, capsys, "--merge", *saved, saved[1], "--minutes", "2")
    t = r["systems"]["tdiff"]
    assert t["seeds"] == 2 and "given twice" in err
    assert t["per_seed"][0]["multiplier"]["value"] == pytest.approx(2 * 354 / 1000)
    assert t["per_seed"][0]["equal_minutes_ratio"] == pytest.approx(354 / 500)


def test_systems_scored_without_a_ladder_leave_the_multiplier_open(saved, monkeypatch, capsys):
    r, err = _main(monkeypatch, capsys, "--merge", saved[1])
    t = r["systems"]["tdiff"]
    assert r["ar_curve"]["minutes"] == [] and t["per_seed"][0]["multiplier"]["value"] is None
    assert t["bars"]["multiplier_le_4"]["pass"] is None and t["bars"]["equal_minutes_ratio_le_2.5"]["pass"] is None
    assert t["bars"]["length_within_10pct"]["pass"] is True
    assert "| tdiff | 2 | 427.0 (354.0–500.0) | –, – | –, – | – |" in err


def test_merge_refuses_results_of_another_judge(saved, monkeypatch, capsys):
    other = json.loads(saved[1].read_text())
    other["real"]["judge_ppl"] = 91.0
    saved[1].write_text(json.dumps(other))
    with pytest.raises(SystemExit) as e:
        _main(monkeypatch, capsys, "--merge", *saved)
    assert str(saved[1]) in str(e.value) and "another judge" in str(e.value)
