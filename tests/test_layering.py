"""The package's layering: which folders of tdiff may import which, and no import cycle.

The package root holds only __init__.py (the Python API) and __main__.py; every other module
lives in a folder named for its layer. Layers, lowest first; a module may import modules of its
own folder and of the folders it is allowed (ALLOWED), never a higher one. Imports inside
functions count too (they are how heavy modules are deferred, not a way around the layering).

  core        errors, seeds, device, log, workers, memory, choices, version
  files       JSONL streams, the safetensors container                 (core)
  text        cleaning, pre-tokenization, SentencePiece                 (core, files)
  data        token-id datasets, latents of a dataset                   (core, files)
  models      the VAE, the DiT, the AR baseline's network               (core, files, data)
  diffusion   process, schedules, solvers, losses, spans                (core, files, data)
  formats     one save/load pair per artifact kind, `tdiff info`        (all of the above)
  sampling    diffusion and AR samplers, control tokens, compiled path  (all of the above)
  evaluation  metrics, perplexity, `tdiff eval` figures, plots          (all of the above)
  training    the loop, checkpoints, the trainers                       (all of the above)
  export      deployable programs                                       (all but training)
  api         tdiff.load and the loaded-artifact classes; tdiff/__init__ (all but cli)
  cli         the Typer app and its commands; __main__                  (everything)

text, data, models and diffusion keep apart where the table says so: models and diffusion
never import each other, and text imports neither.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PKG = ROOT / "tdiff"

LAYERS = ("core", "files", "text", "data", "models", "diffusion", "formats", "sampling", "evaluation", "training",
          "export", "api", "cli")
# layer -> the layers it may import (besides itself)
ALLOWED = {
    "core": set(),
    "files": {"core"},
    "text": {"core", "files"},
    "data": {"core", "files"},
    "models": {"core", "files", "data"},
    "diffusion": {"core", "files", "data"},
    "formats": {"core", "files", "text", "data", "models", "diffusion"},
    "sampling": {"core", "files", "text", "data", "models", "diffusion", "formats"},
    "evaluation": {"core", "files", "text", "data", "models", "diffusion", "formats", "sampling"},
    "training": {"core", "files", "text", "data", "models", "diffusion", "formats", "sampling", "evaluation"},
    "export": {"core", "files", "text", "data", "models", "diffusion", "formats", "sampling", "evaluation"},
    "api": {"core", "files", "text", "data", "models", "diffusion", "formats", "sampling", "evaluation", "training",
            "export"},
    "cli": set(LAYERS) - {"cli"},
}


def layer_of(module: str) -> str:
    """'tdiff.training.loop' -> 'training'; the package itself (tdiff/__init__.py) is the API."""
    parts = module.split(".")[1:]
    if not parts:
        return "api"
    if parts[0] == "__main__":
        return "cli"
    if parts[0] in LAYERS:
        return parts[0]
    raise AssertionError(f"tdiff/{'/'.join(parts)}: module in no layer folder; move it into one (tests/test_layering.py)")


def test_the_package_root_holds_only_the_api_and_main():
    assert sorted(p.name for p in PKG.glob("*.py")) == ["__init__.py", "__main__.py"]
    folders = sorted(p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(LAYERS)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """The tdiff modules PATH imports anywhere in its code (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "tdiff")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "tdiff":
                continue
            for a in node.names:              # `from tdiff import data` imports the module tdiff.data
                sub = f"{mod}.{a.name}"
                out.add(sub if _is_module(sub) else mod)
    return out


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PKG.rglob("*.py"))}


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        lay = layer_of(mod)
        for d in deps:
            dl = layer_of(d)
            if dl != lay and dl not in ALLOWED[lay]:
                bad.append(f"{mod} ({lay}) imports {d} ({dl})")
    return sorted(bad)


def find_cycles(g: dict[str, set[str]]) -> list[str]:
    """Import cycles of G (depth-first search). A package's __init__ importing its own
    submodules (re-exports) is not an edge of a cycle."""
    edges = {m: {d for d in deps if d in g and d != m and not d.startswith(m + ".")} for m, deps in g.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
    return cycles


def test_every_import_respects_the_layers():
    bad = violations(graph())
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_cycle():
    cycles = find_cycles(graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checks_catch_what_they_should():
    """The checkers themselves, on the two defects this test was written against."""
    assert violations({"tdiff.formats.model": {"tdiff.training.checkpoints"}}) == [
        "tdiff.formats.model (formats) imports tdiff.training.checkpoints (training)"]
    assert violations({"tdiff.evaluation.report": {"tdiff.training.train_dit"}})
    assert violations({"tdiff.models.dit": {"tdiff.diffusion.process"}})      # siblings stay apart
    assert violations({"tdiff.core.log": {"tdiff.files.streams"}})
    assert not violations({"tdiff.training.loop": {"tdiff.files.artifacts", "tdiff.formats.model"}})
    cyc = find_cycles({"tdiff.formats.model": {"tdiff.training.train_dit"},
                       "tdiff.training.train_dit": {"tdiff.formats.model"}})
    assert cyc == ["tdiff.formats.model -> tdiff.training.train_dit -> tdiff.formats.model"]
    assert not find_cycles({"tdiff.diffusion": {"tdiff.diffusion.solvers"}, "tdiff.diffusion.solvers": set()})


def test_the_model_file_loads_nothing_from_training():
    code = ("import sys, tdiff.formats.model; m = sorted(k for k in sys.modules if k.startswith('tdiff.training')); "
            "print(','.join(m))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""


def test_choices_match_the_registries():
    """The names offered on the command line are exactly the ones the library implements."""
    from tdiff.models import ar
    from tdiff.core import choices
    from tdiff.diffusion.process import PREDICTION_KINDS
    from tdiff.diffusion.schedules import SCHEDULES
    from tdiff.diffusion.solvers import SOLVERS, TIME_GRIDS
    from tdiff.models import dit, vae

    assert set(choices.SCHEDULES) == set(SCHEDULES)
    assert set(choices.SOLVERS) == set(SOLVERS)
    assert choices.TIME_GRIDS == TIME_GRIDS
    assert choices.VAE_DECODERS == vae.DECODERS
    assert set(choices.TARGETS) == set(PREDICTION_KINDS)
    assert set(choices.PRESETS) == set(dit.PRESETS) == set(vae.PRESETS) == set(ar.PRESETS)
