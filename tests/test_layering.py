"""The package's imports follow the layers of docs/architecture.md, and nothing else.

Every ``import aiayn.x`` / ``from aiayn.x import ...`` in src/aiayn -- at module level, in a
function or under ``TYPE_CHECKING`` -- is read from the source and checked: a module may
import its own package and packages of lower layers, never a higher layer nor a sibling
package of its own layer.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "aiayn"
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"

# Lowest first; the same list as docs/architecture.md ("Layers"). The coarse layers of the
# project (cli/api -> serving/interop/recipes -> training/inference/evaluation ->
# checkpoint/data/text -> model/config/runtime) with the order inside them made explicit.
LAYERS: list[set[str]] = [
    {"errors", "vocab"},
    {"config", "runtime", "fileio"},
    {"model"},
    {"text"},
    {"checkpoint", "data"},
    {"evaluation", "viz"},
    {"training", "inference"},
    {"serving", "interop", "recipes"},
    {"cli", "api"},
    {"__main__"},
]
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def _package(module: str) -> str:
    """'aiayn.training.trainer' -> 'training'; 'aiayn' -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(path: Path, src: Path) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported aiayn module) for every import statement in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("aiayn")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "aiayn":  # from aiayn import training -> aiayn.training
                found += [(node.lineno, f"aiayn.{a.name}") for a in node.names]
            elif node.module.startswith("aiayn."):
                found.append((node.lineno, node.module))
    return found


def violations(src: Path = SRC) -> list[str]:
    out = []
    for path in sorted(src.rglob("*.py")):
        here = _package(_module_name(path, src))
        if here not in LAYER_OF:
            if here:  # a package no layer names is itself a violation
                out.append(f"{path}: package {here!r} is in no layer")
            continue
        for line, target in _imports(path):
            there = _package(target)
            if there == here or not there:
                continue
            if there not in LAYER_OF or LAYER_OF[there] >= LAYER_OF[here]:
                out.append(f"{path.relative_to(src.parent)}:{line}: {here} (layer {LAYER_OF[here]}) "
                           f"imports {target} (layer {LAYER_OF.get(there, '?')})")
    return out


def test_imports_follow_the_layers() -> None:
    assert violations() == []


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in SRC.glob("*.py") if p.stem != "__init__"}
    assert (packages | modules) - set(LAYER_OF) == set()


def test_the_documented_layers_are_the_tested_ones() -> None:
    """docs/architecture.md lists each layer as a line ``layer N: `pkg`, `pkg` ...``."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    documented = [set(re.findall(r"`([a-z_]+)`", line))
                  for line in re.findall(r"^\s*-?\s*layer \d: (.*)$", text, flags=re.MULTILINE)]
    assert documented == LAYERS


@pytest.mark.parametrize("source, expected", [
    ("from aiayn.inference.translator import Translator\n", 1),   # training -> inference: sibling
    ("from aiayn.recipes.train import run_training\n", 1),       # training -> recipes: higher layer
    ("def f():\n    from aiayn.serving import app\n", 1),       # hidden in a function: still counted
    ("from aiayn.checkpoint.directory import save_checkpoint\n", 0),  # lower layer: fine
    ("from aiayn.training.loss import smoothed\n", 0),           # own package: fine
    ("import aiayn.cli.main\n", 1),
])
def test_the_checker_catches_upward_and_sideways_imports(tmp_path: Path, source: str, expected: int) -> None:
    pkg = tmp_path / "aiayn" / "training"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text(source)
    assert len(violations(tmp_path / "aiayn")) == expected
