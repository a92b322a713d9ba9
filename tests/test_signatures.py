"""The translation path passes values, not keyword lists: no function of inference/, serving/ or
cli/ takes more than seven parameters besides ``self`` (a dataclass of options counts as one)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "aiayn"
PACKAGES = ("inference", "serving", "cli")
MOST = 7
# The compiled decoding step's inputs are the flat tensors torch.export traces and an
# AOTInductor package is called with, one argument each (aiayn.inference.compiled.static_step).
EXPORTED_GRAPH_INPUTS = {("inference/compiled.py", "step"), ("inference/step_packages.py", "forward")}


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = fn.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return names[1:] if names and names[0] in ("self", "cls") else names


def test_no_function_takes_more_than_seven_parameters() -> None:
    over = []
    for package in PACKAGES:
        for path in sorted((SRC / package).glob("*.py")):
            where = str(path.relative_to(SRC))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(_parameters(node)) > MOST \
                        and (where, node.name) not in EXPORTED_GRAPH_INPUTS:
                    over.append(f"{where}:{node.lineno} {node.name}: {len(_parameters(node))}")
    assert over == []


def test_the_exported_step_is_the_only_exception_and_still_exists() -> None:
    """The exception list names functions that exist and do take more (else it is stale)."""
    for where, name in EXPORTED_GRAPH_INPUTS:
        tree = ast.parse((SRC / where).read_text(encoding="utf-8"))
        found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
        assert found and max(len(_parameters(n)) for n in found) > MOST, (where, name)
