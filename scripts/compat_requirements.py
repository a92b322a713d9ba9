"""The requirements of one `make test-compat` set, read from pyproject.toml, one per line.

    python scripts/compat_requirements.py lower   # every dependency at the lower bound it claims
    python scripts/compat_requirements.py latest  # the newest transformers, ctranslate2, uvicorn
    python scripts/compat_requirements.py tools [--floors]  # what the tests themselves need

Both sets cover [project.dependencies] and the serve and interop extras:

- ``lower``: each ``name>=X`` becomes ``name==X`` (extras kept), so pip installs exactly
  the versions the package claims to work with.
- ``latest``: the requirements as written (pip takes the newest release each allows), torch
  pinned to ``--torch`` (the oldest release the newest transformers accepts).

``--pin name==V`` (repeatable) replaces that package's line in either set.
``tools``: the dev extra without linters, type stubs, the browser driver and aiayn itself;
with ``--floors`` at their lower bounds where they have one (the lower set: an old starlette's
test client needs an httpx of its time).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
EXTRAS = ("serve", "interop")
NOT_FOR_TESTS = re.compile(r"^(ruff|mypy|types-|playwright|aiayn)", re.IGNORECASE)
REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+)(?P<extras>\[[^\]]*\])?\s*(?P<spec>.*)$")


def name_of(requirement: str) -> str:
    match = REQUIREMENT.match(requirement.strip())
    if match is None:
        raise SystemExit(f"compat_requirements: cannot read requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match["name"]).lower()


def lowest(requirement: str) -> str:
    """``name[extras]>=X,<Y`` -> ``name[extras]==X``; a requirement without a lower bound is
    an error (the set would not be the lowest)."""
    match = REQUIREMENT.match(requirement.strip())
    assert match is not None
    floor = re.search(r">=\s*([^,;\s]+)", match["spec"])
    if floor is None:
        raise SystemExit(f"compat_requirements: {requirement!r} claims no lower bound (>=)")
    return f"{match['name']}{match['extras'] or ''}=={floor[1]}"


def project_requirements(pyproject: dict) -> list[str]:
    project = pyproject["project"]
    found = list(project["dependencies"])
    for extra in EXTRAS:
        found += project["optional-dependencies"][extra]
    return found


def requirements(kind: str, pyproject: dict, torch: str | None, pins: list[str], floors: bool = False) -> list[str]:
    if kind == "tools":
        tools = [r for r in pyproject["project"]["optional-dependencies"]["dev"] if not NOT_FOR_TESTS.match(r)]
        return [lowest(r) if floors and ">=" in r else r for r in tools]
    found = project_requirements(pyproject)
    if kind == "lower":
        found = [lowest(r) for r in found]
    elif torch is not None:
        found = [f"torch=={torch}" if name_of(r) == "torch" else r for r in found]
    by_name = {name_of(r): r for r in found}
    for pin in pins:
        by_name[name_of(pin)] = pin
    return list(by_name.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("kind", choices=["lower", "latest", "tools"])
    parser.add_argument("--torch", help="the torch release of the latest set")
    parser.add_argument("--pin", action="append", default=[], help="name==V replacing that package's line")
    parser.add_argument("--floors", action="store_true", help="tools: at their lower bounds")
    args = parser.parse_args(argv)
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    lines = requirements(args.kind, pyproject, args.torch, args.pin, args.floors)
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
