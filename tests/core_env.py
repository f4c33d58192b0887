"""A Python environment that holds tdiff's declared core dependencies and nothing else.

`make_core_env(dest)` makes a venv (no pip) whose site-packages holds symlinks to exactly the
distributions that `pyproject.toml`'s [project] dependencies need, transitively (markers evaluated
for this interpreter, no extras), taken from the environment running this code, plus a .pth line
for the repository itself. A command that imports anything undeclared (protobuf, matplotlib,
onnx, snownlp …) fails there as it would after `pip install tdiff`. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared() -> list[str]:
    """The [project] dependencies of pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["dependencies"]


def closure(requirements: list[str]) -> dict[str, md.Distribution]:
    """The installed distributions that REQUIREMENTS need, transitively, without extras."""
    from packaging.requirements import Requirement

    out: dict[str, md.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = req.name.lower().replace("_", "-")
        if key in out:
            continue
        dist = md.distribution(req.name)            # PackageNotFoundError: not installed here at all
        out[key] = dist
        todo += dist.requires or []
    return out


def _top_level(dist: md.Distribution) -> set[str]:
    """The names directly under site-packages that DIST installed (packages, modules, its .dist-info)."""
    names = set()
    for f in dist.files or []:
        first = Path(str(f)).parts[0]
        if first not in ("..", "__pycache__") and not first.endswith(".pth"):
            names.add(first)
    return names


def make_core_env(dest: Path) -> Path:
    """Make the venv at DEST; return its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    py = dest / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in closure(declared()).values():
        base = Path(dist.locate_file(""))
        for name in _top_level(dist):
            src = base / name
            if src.exists() and not (site / name).exists():
                os.symlink(src, site / name)
    (site / "tdiff-source.pth").write_text(str(ROOT) + "\n")
    assert here.exists()
    return py
