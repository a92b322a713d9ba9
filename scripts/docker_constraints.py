"""Write docker/constraints.txt: the exact versions the image installs, taken from the
environment this runs in (where the tests passed) for aiayn[serve] and everything it pulls in.

    .venv/bin/python scripts/docker_constraints.py          # rewrite docker/constraints.txt
    .venv/bin/python scripts/docker_constraints.py --check  # exit 1 if it differs

The Dockerfile installs torch and then ``.[serve]`` with ``-c constraints.txt``, so a rebuild
gets the same versions as the last one instead of whatever was released since.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docker" / "constraints.txt"
HEADER = (
    "# The versions the image installs (Dockerfile: pip install -c constraints.txt): aiayn[serve]\n"
    "# and all it pulls in, as tested. Regenerate from a tested environment with\n"
    "# `python scripts/docker_constraints.py` after changing a dependency (docs/deploying.md).\n"
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str, extras: set[str]) -> dict[str, str]:
    """name -> installed version of ``root`` and of every requirement it pulls in (markers
    evaluated for this interpreter and the extras asked for)."""
    found: dict[str, str] = {}
    pending: list[tuple[str, set[str]]] = [(root, extras)]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, wanted = pending.pop()
        key = (canonical(name), frozenset(wanted))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            sys.exit(f"docker_constraints: {name} is required but not installed here")
        found[canonical(dist.metadata["Name"])] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not any(
                req.marker.evaluate({**default_environment(), "extra": extra}) for extra in (wanted or {""})
            ):
                continue
            pending.append((req.name, set(req.extras)))
    return found


def render() -> str:
    versions = closure("aiayn", {"serve"})
    versions.pop("aiayn", None)
    # A local label (2.13.0+cpu) names the index, not the release: the index is the Dockerfile's.
    lines = [f"{name}=={version.split('+')[0]}" for name, version in sorted(versions.items())]
    return HEADER + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docker/constraints.txt differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(REPO)} differs from this environment's versions", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)} ({text.count(chr(10)) - HEADER.count(chr(10))} packages)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
