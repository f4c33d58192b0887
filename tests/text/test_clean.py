"""`tdiff clean`: the library (exact strings) and the command (exit codes, streams, files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, head_lines, run_cli, shared_file
from tdiff.text.clean import (
    Cleaner,
    chunk_text,
    collapse_whitespace,
    normalize_text,
    remove_controls,
    split_sentences,
)

POEM = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"


def _records(stdout: bytes) -> list[dict]:
    return [json.loads(line) for line in stdout.decode("utf-8").splitlines()]


# --- normalization -----------------------------------------------------------------


def test_nfc():
    assert normalize_text("e\u0301") == "\u00e9"
    assert normalize_text("\u1112\u1161\u11ab") == "\ud55c"  # Hangul jamo → 한


def test_zero_width_removed():
    assert normalize_text("a\u200bb\u200cc\u200dd\u200ee\u200ff\ufeffg\u2060h") == "abcdefgh"
    assert normalize_text("\ufeff床前明月光") == "床前明月光"


def test_control_characters_removed():
    assert remove_controls("a\x00b\x07c\x1bd\x7fe\x80f\x9fg") == "abcdefg"
    # tab, newline and the whitespace controls survive removal and become spaces later
    assert remove_controls("a\tb\nc\rd\x0be\x0cf\x85g") == "a\tb\nc\rd\x0be\x0cf\x85g"
    assert normalize_text("a\tb\rc\x85d\x0ce") == "a b c d e"


def test_whitespace_collapsed():
    assert collapse_whitespace("  a \t\t b  c ") == "a b c"
    # U+3000 (ideographic space), NBSP and other Unicode spaces count as spaces
    assert normalize_text("\u3000\u3000床前明月光\u3000疑是地上霜\u00a0\u2003x ") == "床前明月光 疑是地上霜 x"
    # inside a multi-line text: lines stripped, blank lines dropped, newlines kept
    assert normalize_text("  a  b \n\n \t c \n") == "a b\nc"
    assert normalize_text(" \u200b \t ") == ""


# --- punctuation -----------------------------------------------------------------------

FULL_CASES = [
    ("你好,世界!", "你好，世界！"),
    ("圆周率是3.14,对吧?", "圆周率是3.14，对吧？"),
    ("约3.14米", "约3.14米"),
    ("共100.", "共100。"),
    ("来自U.S.A.的人", "来自U.S.A.的人"),
    ("访问www.x.com,然后", "访问www.x.com，然后"),
    ("1,000元", "1,000元"),
    ("10:30开会", "10:30开会"),
    ("你好 , 世界", "你好，世界"),
    ("你好!!", "你好！！"),
    ("等等...", "等等……"),
    ("中文 (English) 中文", "中文（English）中文"),
    ("（你好,世界）", "（你好，世界）"),
    ("函数f(x)的值", "函数f(x)的值"),
    ("他说:好;走吧", "他说：好；走吧"),
    # English and numbers outside Chinese context are untouched
    ("Hello, world. 3.14 is pi!", "Hello, world. 3.14 is pi!"),
    ("The word (你好) means hello.", "The word (你好) means hello."),
]


@pytest.mark.parametrize("text,expected", FULL_CASES)
def test_punct_full(text, expected):
    assert normalize_text(text, punct="full") == expected


def test_punct_no_protect_converts_inside_runs():
    assert normalize_text("约3.14米", punct="full", protect=False) == "约3。14米"
    assert normalize_text("来自U.S.A.的人", punct="full", protect=False) == "来自U.S.A。的人"
    assert normalize_text("函数f(x)的值", punct="full", protect=False) == "函数f（x）的值"
    # protection only shields digit/letter runs; plain English stays English either way
    assert normalize_text("Hello, world.", punct="full", protect=False) == "Hello, world."


def test_punct_half():
    assert normalize_text("你好，世界！（注）真的？是；对：嗯。", punct="half") == "你好,世界!(注)真的?是;对:嗯."
    assert normalize_text("Pi is 3.14.", punct="half") == "Pi is 3.14."


def test_punct_keep_is_default():
    assert normalize_text("你好,世界！") == "你好,世界！"
    with pytest.raises(ValueError):
        normalize_text("x", punct="wide")


def test_normalize_is_idempotent_on_real_text():
    lines = head_lines(shared_file("songci.txt"), 300) + head_lines(shared_file("tinyshakespeare.txt"), 300)
    for mode in ("keep", "full", "half"):
        for line in lines:
            once = normalize_text(line, punct=mode)
            assert normalize_text(once, punct=mode) == once


# --- sentences and chunks ---------------------------------------------------------------------


def test_split_sentences_chinese():
    text = "床前明月光，疑是地上霜。他说：“好！”然后走了……真的？是；"
    assert split_sentences(text) == ["床前明月光，疑是地上霜。", "他说：“好！”", "然后走了……", "真的？", "是；"]


def test_split_sentences_english():
    text = 'Hello there. Pi is 3.14 e.g. this one! Is it? "Yes." And www.x.com is up'
    assert split_sentences(text) == [
        "Hello there.",
        "Pi is 3.14 e.g. this one!",
        "Is it?",
        '"Yes."',
        "And www.x.com is up",
    ]


def test_chunk_packs_whole_sentences():
    assert chunk_text(POEM, 0) == [POEM]
    assert chunk_text(POEM, 24) == [POEM]
    assert chunk_text(POEM, 23) == ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。"]
    assert chunk_text("一。二。三。四五六。", 4) == ["一。二。", "三。", "四五六。"]
    text = "One two. Three four. Five six seven eight."
    assert chunk_text(text, 21) == ["One two. Three four.", "Five six seven eight."]
    assert chunk_text("", 10) == []


def test_chunk_cuts_a_too_long_sentence_at_comma_or_space():
    assert chunk_text(POEM, 6) == ["床前明月光，", "疑是地上霜。", "举头望明月，", "低头思故乡。"]
    assert chunk_text("Alpha, beta gamma delta. Short.", 15) == ["Alpha, beta", "gamma delta.", "Short."]
    # no comma or space: a hard cut, moved back one character so no piece starts with a mark
    assert chunk_text("床前明月光疑是地上霜。", 5) == ["床前明月光", "疑是地上", "霜。"]
    assert chunk_text("abcdefghijk", 4) == ["abcd", "efgh", "ijk"]


def test_chunks_respect_limit_and_lose_nothing_on_real_text():
    for line in head_lines(shared_file("songci.txt"), 200):
        for limit in (7, 30, 100):
            chunks = chunk_text(line, limit)
            assert all(0 < len(c) <= limit for c in chunks)
            assert "".join(chunks) == line  # Chinese text has no spaces to drop between chunks


# --- the record pipeline ------------------------------------------------------------------


def test_cleaner_min_chars_and_dedup():
    c = Cleaner(min_chars=3, dedup=True)
    out = [c.clean(t) for t in ["你好世界", "  你好世界 ", "短", "", "\u200b", "另一首诗"]]
    assert out == [["你好世界"], [], [], [], [], ["另一首诗"]]
    st = c.stats
    assert (st.records_in, st.records_out, st.duplicates, st.short, st.empty) == (6, 2, 1, 1, 2)
    assert st.chars_out == 8


def test_cleaner_records_keep_fields_when_chunked():
    c = Cleaner(max_chars=12)
    recs = list(c.records([{"text": POEM, "label": "静夜思", "id": 7}]))
    assert recs == [
        {"text": "床前明月光，疑是地上霜。", "label": "静夜思", "id": 7},
        {"text": "举头望明月，低头思故乡。", "label": "静夜思", "id": 7},
    ]
    assert c.stats.split == 1
    out = list(Cleaner().records([{"body": " a ", "x": 1}], field="body"))
    assert out == [{"body": "a", "x": 1}]


# --- the command ------------------------------------------------------------------------------


def test_cli_lines_to_records_and_stats_on_stderr():
    r = run_cli(["clean", "--punct", "full"], input="你好,世界!\n\n  a \t b \n")
    assert r.returncode == 0, r.stderr
    assert _records(r.stdout) == [{"text": "你好，世界！"}, {"text": "a b"}]
    err = r.stderr.decode()
    assert "3 records in, 2 out" in err and "MB/s" in err
    assert run_cli(["clean", "--quiet"], input="x\n").stderr == b""


def test_cli_paragraphs():
    text = "First Citizen:\nBefore we proceed.\n\n\nAll:\nSpeak, speak.\n"
    r = run_cli(["clean", "--paragraphs"], input=text)
    assert r.returncode == 0, r.stderr
    assert _records(r.stdout) == [
        {"text": "First Citizen:\nBefore we proceed."},
        {"text": "All:\nSpeak, speak."},
    ]


def test_cli_dedup_min_chars_max_chars():
    r = run_cli(["clean", "--dedup", "--min-chars", "3", "--max-chars", "12"], input=f"{POEM}\n{POEM}\n短\n")
    assert r.returncode == 0, r.stderr
    assert [d["text"] for d in _records(r.stdout)] == ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。"]
    assert "2 duplicates" in r.stderr.decode() and "1 short" in r.stderr.decode()


def test_cli_jsonl_keeps_label_and_author():
    lines = head_lines(shared_file("songci.jsonl"), 500)
    r = run_cli(["clean", "--jsonl", "--max-chars", "40"], input="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    recs = _records(r.stdout)
    assert len(recs) > 500
    assert all(set(d) == {"text", "label", "author"} for d in recs)
    assert all(0 < len(d["text"]) <= 40 for d in recs)
    first = json.loads(lines[0])
    assert recs[0]["label"] == first["label"] and recs[0]["author"] == first["author"]


def test_cli_jsonl_other_field():
    r = run_cli(["clean", "--jsonl", "--field", "body"], input='{"body": " a  b ", "id": 1}\n')
    assert _records(r.stdout) == [{"body": "a b", "id": 1}]
    r = run_cli(["clean", "--jsonl"], input='{"body": "a"}\n')
    assert r.returncode == 65 and b"<stdin>:1" in r.stderr and b"'text'" in r.stderr


def test_cli_invalid_utf8_replaced_and_counted():
    r = run_cli(["clean"], input=b"ok\n\xff\xfebad\nfine\n")
    assert r.returncode == 0
    assert [d["text"] for d in _records(r.stdout)] == ["ok", "\ufffd\ufffdbad", "fine"]
    err = r.stderr.decode()
    assert "1 lines with invalid UTF-8" in err and "line 2" in err


def test_cli_invalid_utf8_strict_is_error():
    r = run_cli(["clean", "--strict"], input=b"ok\n\xff\xfebad\n")
    assert r.returncode == 65
    assert b"<stdin>:2" in r.stderr and b"invalid UTF-8" in r.stderr
    assert b"Traceback" not in r.stderr


def test_cli_malformed_jsonl_names_line():
    r = run_cli(["clean", "--jsonl"], input='{"text": "a"}\n\n{"text": oops}\n')
    assert r.returncode == 65
    assert b"<stdin>:3" in r.stderr and b"malformed JSON" in r.stderr
    assert b"Traceback" not in r.stderr


def test_cli_empty_input():
    r = run_cli(["clean"], input=b"")
    assert r.returncode == 0 and r.stdout == b""


def test_cli_missing_input_and_bad_usage(tmp_path):
    r = run_cli(["clean", "-i", tmp_path / "nope.txt"])
    assert r.returncode == 66 and b"nope.txt" in r.stderr
    r = run_cli(["clean", "--no-such-option"], input="x\n")
    assert r.returncode == 2 and b"Traceback" not in r.stderr
    assert run_cli(["clean", "--punct", "wide"], input="x\n").returncode == 2
    assert run_cli(["clean", "--max-chars", "-1"], input="x\n").returncode == 2
    r = run_cli(["clean", "--jsonl", "--paragraphs"], input="x\n")
    assert r.returncode == 2 and b"--paragraphs" in r.stderr


def test_cli_config_file_and_flag_override(tmp_path):
    cfg = tmp_path / "clean.yaml"
    cfg.write_text("punct: full\nmax-chars: 12\n", encoding="utf-8")
    r = run_cli(["clean", "--config", cfg], input=POEM.replace("，", ",") + "\n")
    assert [d["text"] for d in _records(r.stdout)] == ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。"]
    r = run_cli(["clean", "--config", cfg, "--punct", "keep"], input="你好,世界。\n")
    assert _records(r.stdout) == [{"text": "你好,世界。"}]


def test_cli_config_unknown_key_is_usage_error(tmp_path):
    cfg = tmp_path / "clean.yaml"
    cfg.write_text("punkt: full\n", encoding="utf-8")
    r = run_cli(["clean", "--config", cfg], input="x\n")
    assert r.returncode == 2 and b"punkt" in r.stderr and b"Traceback" not in r.stderr


def test_cli_dump_config_prints_yaml(tmp_path):
    import yaml

    cfg = tmp_path / "clean.yaml"
    cfg.write_text("dedup: true\n", encoding="utf-8")
    r = run_cli(["clean", "--config", cfg, "--dump-config", "--punct", "half", "--max-chars", "64"])
    assert r.returncode == 0, r.stderr
    conf = yaml.safe_load(r.stdout)
    assert conf["punct"] == "half" and conf["max_chars"] == 64 and conf["dedup"] is True
    assert conf["protect"] is True and conf["input"] == "-"


def test_cli_output_file_is_atomic(tmp_path):
    out = tmp_path / "out" / "clean.jsonl"
    r = run_cli(["clean", "-o", out], input="a\nb\n")
    assert r.returncode == 0 and r.stdout == b""
    assert _records(out.read_bytes()) == [{"text": "a"}, {"text": "b"}]
    assert os.listdir(out.parent) == ["clean.jsonl"]
    # a failing run leaves neither a partial output nor a temp file behind
    bad = tmp_path / "bad.jsonl"
    r = run_cli(["clean", "--jsonl", "-o", bad], input='{"text": "a"}\n{broken\n')
    assert r.returncode == 65
    assert not bad.exists()
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_cli_closed_pipe_exits_quietly(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text((POEM + "\n") * 10000, encoding="utf-8")  # ~0.7 MB: far more than a pipe buffer
    cmd = f'"{sys.executable}" -m tdiff clean -i "{big}" | head -1; exit "${{PIPESTATUS[0]}}"'
    env = dict(os.environ, PYTHONUTF8="1")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, cwd=ROOT, env=env, timeout=60)
    assert r.returncode in (0, 141), r.stderr
    assert json.loads(r.stdout) == {"text": POEM}
    assert b"Traceback" not in r.stderr and b"Error" not in r.stderr
