"""benchmarks/ and scripts/ are on pytest's `pythonpath` (pyproject.toml), so the tests import
their code by module name (`import serve_load`), as the benchmarks import each other. That
holds while no module of theirs shares its name with another of theirs, the standard
library's, or one installed: it would shadow that one, or be shadowed."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("benchmarks", "scripts")


def _modules(folder: str) -> list[str]:
    return sorted(p.stem for p in (REPO / folder).glob("*.py"))


def test_the_folders_are_on_the_import_path() -> None:
    assert {str(REPO / folder) for folder in FOLDERS} <= {str(Path(p).resolve()) for p in sys.path if p}


@pytest.mark.parametrize("folder", FOLDERS)
def test_each_module_name_is_found_in_its_folder_and_nowhere_else(folder: str) -> None:
    ours = {REPO / f for f in FOLDERS}
    elsewhere = [p for p in sys.path if p and Path(p).resolve() not in ours]
    other_folder = {name for f in FOLDERS if f != folder for name in _modules(f)}
    names = _modules(folder)
    assert names, f"no modules in {folder}/"
    for name in names:
        assert name not in sys.stdlib_module_names, f"{folder}/{name}.py is named like a standard module"
        assert name not in other_folder, f"{name}.py is in both benchmarks/ and scripts/"
        found = importlib.machinery.PathFinder.find_spec(name, elsewhere)
        assert found is None, f"{folder}/{name}.py is named like {found.origin}"
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        assert Path(spec.origin).resolve() == REPO / folder / f"{name}.py"
