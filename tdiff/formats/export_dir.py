"""The `tdiff export` directory: one save/load pair, `save_export` / `load_export`.

    DIR/config.json              what was exported (format, dtype, source file and sha256, programs'
                                 signatures, verification figures); the key MARKER marks the layout
    DIR/<program or model files> denoiser/decoder/schedule programs, or a slim model.safetensors
    DIR/tokenizer.model          the SentencePiece model (programs formats)
    DIR/tdiff-manifest.json      every other file with its size and sha256, sealed (`_seal`)

The directory is assembled beside its destination and moved into place whole; an existing one is
replaced only when it is empty or an unchanged earlier export (`check_target`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from tdiff.core.errors import OutputError


MARKER = "tdiff_export"      # key of config.json: the version of the directory's layout


MANIFEST = "tdiff-manifest.json"   # every file the export wrote, with its size and sha256, sealed (`_seal`)


MANIFEST_MAX_BYTES = 1 << 20


def _seal(files) -> str:
    """The manifest's own hash: sha256 of its file list as canonical JSON. A file that merely looks like
    a manifest (hand-written, another tool's, edited) does not carry the seal of its contents."""
    blob = json.dumps({"tdiff_export_manifest": 1, "files": files}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def write_manifest(d: Path) -> None:
    """List every file of directory D (name, bytes, sha256) in D/MANIFEST, sealed."""
    from tdiff.files.streams import file_sha256

    files = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in sorted(d.iterdir())}
    text = json.dumps({"tdiff_export_manifest": 1, "files": files, "seal": _seal(files)}, indent=1)
    (d / MANIFEST).write_text(text + "\n", encoding="utf-8")


def _manifest_files(d: Path) -> dict | None:
    """{name: {"bytes", "sha256"}} of D's manifest, or None when it is not one `write_manifest` wrote:
    not a regular file, too large, not JSON, another layout, or a seal that does not match."""
    m = d / MANIFEST
    try:
        st = m.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > MANIFEST_MAX_BYTES:
            return None
        obj = json.loads(m.read_text(encoding="utf-8"))
        files = obj.get("files") if isinstance(obj, dict) else None
        if not isinstance(files, dict) or obj.get("seal") != _seal(files):
            return None
    except (OSError, ValueError, RecursionError):        # unreadable, not UTF-8 or JSON, nested too deeply
        return None
    good = all(isinstance(r, dict) and type(r.get("bytes")) is int and isinstance(r.get("sha256"), str)
               for r in files.values())
    return files if good else None


def _names(names) -> str:
    """Up to three of NAMES for a message, and how many more."""
    names = sorted(names)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _replace_problem(d: Path) -> str | None:
    """Why directory D may not be replaced by an export, or None: it is empty, or it holds exactly the
    files its manifest lists, each unchanged (so nothing of the user's can be lost)."""
    from tdiff.files.streams import file_sha256

    present = set(os.listdir(d))
    if not present:
        return None
    if MANIFEST not in present:
        return f"a non-empty directory not written by `tdiff export` (it has no {MANIFEST})"
    files = _manifest_files(d)
    if files is None:
        return f"its {MANIFEST} is not one `tdiff export` wrote (damaged, edited or hand-made)"
    extra = present - set(files) - {MANIFEST}
    if extra:
        return f"it holds files `tdiff export` did not write ({_names(extra)})"
    missing = set(files) - present
    if missing:
        return f"files of the export are gone ({_names(missing)})"
    for name, rec in sorted(files.items()):
        st = (d / name).lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_size != rec["bytes"] or file_sha256(d / name) != rec["sha256"]:
            return f"{name} changed since `tdiff export` wrote it"
    return None


def _target(out: Path) -> Path:
    """The directory that -o OUT names: a symlink's final target (the link itself stays), else OUT; absolute."""
    try:
        return Path(os.path.realpath(out, strict=out.is_symlink()))
    except (OSError, RuntimeError):
        raise OutputError(f"-o {out}: a symlink that leads nowhere (dangling, or a loop); remove it or give "
                          "another name") from None


def check_target(out: Path) -> Path:
    """The directory to write for -o OUT (through a symlink, its target), checked: absent, empty, or an
    earlier `tdiff export` directory whose files all still match its manifest. Else OutputError (exit
    73) saying why; nothing is touched."""
    out = Path(out)
    target = _target(out)
    shown = f"-o {out}" + (f" (a symlink to {target})" if out.is_symlink() else "")
    if not os.path.lexists(target):
        return target
    if not target.is_dir():
        raise OutputError(f"{shown}: exists and is not a directory")
    try:
        why = _replace_problem(target)
    except OSError as e:
        raise OutputError(f"{shown}: cannot be read ({e.strerror or e})") from None
    if why:
        raise OutputError(f"{shown}: {why}; refusing to replace it (remove it or choose another -o)")
    return target


def _temp_dir(beside: Path) -> Path:
    """A new folder beside BESIDE named `.NAME.PID.<random>.tmp`: tdiff.files.streams.remove_stale_temps removes it
    on a later run once this process is gone (killed with -9, say)."""
    return Path(tempfile.mkdtemp(prefix=f".{beside.name}.{os.getpid()}.", suffix=".tmp", dir=beside.parent))


def install_dir(tmp: Path, out: Path) -> None:
    """Move the finished TMP directory into place as -o OUT (through a symlink: as its target, the link
    stays), replacing an earlier export there after checking it once more (`check_target`). The earlier
    one is moved aside first and put back if the move fails."""
    target = check_target(out)
    old = None
    try:
        if os.path.lexists(target):
            old = _temp_dir(target)
            os.replace(target, old / "d")
        os.replace(tmp, target)
    except BaseException:
        if old is not None and (old / "d").exists() and not os.path.lexists(target):
            os.replace(old / "d", target)                  # put the earlier export back
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def save_export(out: Path, write) -> Path:
    """Write an export directory at OUT (through a symlink: at its target): WRITE(tmp) writes the
    export's files into an empty temporary folder beside OUT and returns its config (a dict, written
    as config.json); then the manifest is sealed and the folder moved into place (`install_dir`).
    On any failure OUT is left as it was. Returns the directory written."""
    from tdiff.files.streams import remove_stale_temps

    target = check_target(out)
    remove_stale_temps(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_dir(target)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)                      # mkdtemp makes 0700; a model directory is for sharing
        config = write(tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        write_manifest(tmp)
        install_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def load_export(path) -> dict:
    """{"dir", "config", "files"} of the export directory PATH, checked first: its manifest is one
    `save_export` sealed and every file it lists is there, unchanged (else a DataError saying what is
    wrong). "files" maps each file to its {"bytes", "sha256"}."""
    from tdiff.core.errors import DataError, NoInputError

    d = Path(path)
    if not d.is_dir():
        raise NoInputError(f"'{d}': no such directory")
    if not (d / MANIFEST).is_file():
        raise DataError(f"'{d}': not a `tdiff export` directory (no {MANIFEST})")
    why = _replace_problem(d)
    if why:
        raise DataError(f"'{d}': {why}")
    files = _manifest_files(d)
    try:
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"'{d / 'config.json'}': not readable JSON ({e})") from None
    if not isinstance(config, dict) or config.get(MARKER) != 1:
        raise DataError(f"'{d / 'config.json'}': not the config of a `tdiff export` directory")
    return {"dir": str(d), "config": config, "files": files}
