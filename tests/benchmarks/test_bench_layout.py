"""The layout of bench/: benchmarks are modules run as `python -m bench.GROUP.NAME`, importable without
doing any work, sharing bench/common.py, never editing the import path, and all listed in bench/README.md."""

from __future__ import annotations

import importlib
import re

import pytest

from conftest import ROOT

BENCH = ROOT / "bench"
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                 for p in BENCH.rglob("*.py") if p.name != "__init__.py")
SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in BENCH.rglob("*.sh"))
LIBRARIES = {"bench.common", "bench.quality.text_stats"}          # imported by benchmarks, not run


def test_the_layout_is_found():
    assert {"bench.common", "bench.speed.speed_vs_ar", "bench.quality.frontier"} <= set(MODULES)
    assert "bench/run_all.sh" in SCRIPTS and "bench/quality/recipe.sh" in SCRIPTS


@pytest.mark.parametrize("path", sorted(BENCH.rglob("*.py")) + sorted(BENCH.rglob("*.sh")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_edits_the_import_path(path):
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"sys\.path|PYTHONPATH", text), f"{path.relative_to(ROOT)} edits the import path"


@pytest.mark.parametrize("script", SCRIPTS)
def test_shell_scripts_run_modules_not_files(script):
    calls = re.findall(r"python3?\s+\S+\.py\b", (ROOT / script).read_text(encoding="utf-8"))
    assert not calls, f"{script} runs Python files {calls}: run `python -m bench.GROUP.NAME`"


def test_every_benchmark_is_in_the_index():
    index = (BENCH / "README.md").read_text(encoding="utf-8")
    missing = [m for m in MODULES if f"`{m}`" not in index and f"`{m.replace('.', '/')}.py`" not in index]
    missing += [s for s in SCRIPTS if f"`{s}`" not in index]
    assert not missing, f"bench/README.md does not list {missing}"
    listed = set(re.findall(r"`(bench\.[a-z_]+\.[a-z_]+)`", index))
    assert not listed - set(MODULES), f"bench/README.md lists modules that do not exist: {listed - set(MODULES)}"


def test_run_all_defaults_are_modules():
    text = (BENCH / "run_all.sh").read_text(encoding="utf-8")
    default = re.search(r'BENCHES=\$\{BENCHES:-"([^"]+)"\}', text).group(1).split()
    assert default and all(f"bench.{b}" in MODULES for b in default), default


@pytest.mark.parametrize("module", MODULES)
def test_bench_modules_import_without_doing_work(module, capfd):
    mod = importlib.import_module(module)
    out, err = capfd.readouterr()
    assert out == "" and err == "", f"importing {module} printed {out + err!r}"
    if module not in LIBRARIES:                                   # a benchmark: main() runs only as a script
        assert callable(getattr(mod, "main", None)), f"{module} has no main()"
        assert 'if __name__ == "__main__":' in (ROOT / (module.replace(".", "/") + ".py")).read_text()
