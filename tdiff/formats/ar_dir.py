"""The train-ar directory (`tdiff train-ar -o DIR`): one save/load pair, `save_ar` / `load_ar`.

A standard transformers directory, so any transformers code loads it offline
(`AutoModelForCausalLM.from_pretrained(DIR)`), plus tdiff's own tdiff.json:

    DIR/config.json              GPT2Config; bos 1, eos 2, pad 3 (the tokenizer's ids)
    DIR/generation_config.json
    DIR/model.safetensors        EMA weights, fp32
    DIR/tok.model                the SentencePiece model (+ tok.vocab, tok.model.json sidecar)
    DIR/tokenizer.json           the same vocabulary for `AutoTokenizer.from_pretrained(DIR)` (+ tokenizer_config.json):
                                 a fast tokenizer with our bos/eos/pad/unk, adding no special tokens itself;
                                 `transformers.pipeline("text-generation", model=DIR)` runs offline
    DIR/tdiff.json               {"format": 1, "kind": "ar", "tokenizer": "tok.model", "train": {...}}
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tdiff.core.errors import DataError, NoInputError, TdiffError, UsageError
from tdiff.models.ar import MAX_POSITIONS, quiet_transformers

FORMAT = 1
KIND = "ar"
META_FILE = "tdiff.json"
TOKENIZER_FILE = "tok.model"
WEIGHTS_FILE = "model.safetensors"     # the only weights read: never a pickled pytorch_model.bin


def write_transformers_tokenizer(directory, tok, model_max_length: int) -> None:
    """Write tokenizer.json + tokenizer_config.json into DIRECTORY so that transformers' AutoTokenizer
    (and so `pipeline`) loads tdiff's vocabulary offline: the SentencePiece model converted by
    transformers to a fast tokenizer, with our special pieces as bos/eos/pad/unk.

    Decoding equals `Tokenizer.decode`. Encoding equals `Tokenizer.encode` for tokenizers trained
    without pre-tokenization; for `--pretokenize jieba` ones AutoTokenizer does not segment with jieba
    first, so ids may differ where jieba moves a piece boundary (measured: docs/RESULTS.md, "Export")."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    sp = tok._sp
    special = {"bos_token": tok.bos_id, "eos_token": tok.eos_id, "pad_token": tok.pad_id, "unk_token": tok.unk_id}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
              "model_max_length": model_max_length,
              **{k: sp.id_to_piece(i) for k, i in special.items() if i is not None and i >= 0}}
    with tempfile.TemporaryDirectory() as tmp, quiet_transformers():
        shutil.copyfile(Path(directory) / TOKENIZER_FILE, Path(tmp) / "tokenizer.model")
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        fast = AutoTokenizer.from_pretrained(tmp)
        fast.save_pretrained(str(directory))


def check_transformers_tokenizer(tok) -> None:
    """Convert TOK for AutoTokenizer into a scratch folder, before training: a transformers release
    that cannot convert it (a missing converter dependency, a changed API) fails in a second, not
    after the training. TdiffError naming the cause; nothing is kept."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tok.save(Path(tmp) / TOKENIZER_FILE)
        try:
            write_transformers_tokenizer(tmp, tok, MAX_POSITIONS)
        except Exception as e:
            import transformers

            raise TdiffError(f"transformers {transformers.__version__} cannot convert the tokenizer for "
                             f"AutoTokenizer ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}); "
                             "install the versions in constraints.txt (make install)") from None


def read_meta(path) -> dict | None:
    """DIR/tdiff.json as a dict, or None when it is missing or unreadable."""
    try:
        meta = json.loads((Path(path) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_ar_dir(path) -> bool:
    """True when PATH is a directory written by `tdiff train-ar`."""
    p = Path(path)
    if not p.is_dir():
        return False
    meta = read_meta(p)
    return meta is not None and meta.get("kind") == KIND


def check_ar_dir(path) -> dict:
    """The tdiff.json of an AR directory; NoInputError / DataError saying what is wrong otherwise."""
    p = Path(path)
    if not p.exists():
        raise NoInputError(f"AR model '{p}' does not exist")
    hint = "give the directory written by `tdiff train-ar -o DIR`"
    if not p.is_dir():
        raise DataError(f"'{p}' is a file, not an AR model directory; {hint}")
    for name in (META_FILE, "config.json", TOKENIZER_FILE, WEIGHTS_FILE):
        if not (p / name).is_file():
            raise DataError(f"'{p}' has no {name}, so it is not a tdiff AR model directory; {hint}")
    meta = read_meta(p)
    if meta is None:
        raise DataError(f"{p / META_FILE}: not a JSON object; {hint}")
    if meta.get("kind") != KIND:
        raise DataError(f"{p / META_FILE}: kind is {meta.get('kind')!r}, expected 'ar'; {hint}")
    fmt = meta.get("format")
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise DataError(f"{p / META_FILE}: format {fmt!r} is newer than this tdiff understands ({FORMAT}); upgrade tdiff")
    return meta


def load_ar(path, device="cpu"):
    """(model in eval mode on DEVICE, Tokenizer) from an AR directory; never touches the network."""
    from tdiff.text.tokenizer import Tokenizer

    check_ar_dir(path)
    p = Path(path)
    tok = Tokenizer.load(p / TOKENIZER_FILE, hint="the AR model directory is damaged; train it again with `tdiff train-ar`")
    from transformers import AutoModelForCausalLM

    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(str(p), local_files_only=True, use_safetensors=True)
    except Exception as e:  # OSError, ValueError, safetensors errors: all mean a broken directory
        msg = str(e).strip().splitlines()
        raise DataError(f"'{p}': cannot load the transformers model ({msg[0] if msg else type(e).__name__})") from None
    if model.config.vocab_size != tok.vocab_size:
        raise DataError(f"'{p}': model vocabulary {model.config.vocab_size} does not match "
                        f"{TOKENIZER_FILE} ({tok.vocab_size} pieces)")
    model.loss_type = "ForCausalLM"
    return model.to(device).eval(), tok


def check_ar_output(output: Path) -> None:
    """Refuse to replace anything but an earlier train-ar directory (or an empty one)."""
    if not output.exists():
        return
    if output.is_dir() and (is_ar_dir(output) or not any(output.iterdir())):
        return
    what = "a file" if not output.is_dir() else "a directory that is not from `tdiff train-ar`"
    raise UsageError(f"-o/--output '{output}' is {what}; choose a new directory name (it is replaced as a whole)")


def save_ar(output: Path, model, tok, train: dict) -> None:
    """Write the train-ar directory (the layout `load_ar` reads): the transformers model MODEL, the
    Tokenizer TOK in both forms, and tdiff.json with TRAIN (the provenance). It is assembled in a
    temporary folder beside OUTPUT, then renamed into place; an earlier directory there is put back if
    that fails."""
    from tdiff.core.version import __version__

    meta = {"format": FORMAT, "kind": KIND, "tokenizer": TOKENIZER_FILE, "tdiff_version": __version__, "train": train}
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.{os.getpid()}.", suffix=".tmp", dir=output.parent))
    old = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)                      # mkdtemp makes 0700
        with quiet_transformers():                         # stderr shows tdiff's own lines only
            model.save_pretrained(str(tmp))                # safetensors by default (transformers ≥ 4.35)
        if not (tmp / "model.safetensors").exists():
            raise TdiffError(f"transformers did not write model.safetensors into {tmp}")
        tok.save(tmp / TOKENIZER_FILE)                     # tok.model, tok.vocab, tok.model.json
        write_transformers_tokenizer(tmp, tok, model.config.n_positions)   # AutoTokenizer / pipeline
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)                    # a model directory is for sharing
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".old", dir=output.parent))
            os.replace(output, old / "d")
        os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and (old / "d").exists() and not output.exists():
            os.replace(old / "d", output)                  # put the previous model back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
