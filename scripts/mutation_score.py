"""The mutation score per module from ``mutmut results --all true`` (read on stdin).

A mutant counts as killed when a test failed or timed out on it; as survived when the tests
passed on it or none covered it. Mutants reviewed as equivalent (no test can tell them from
the original: listed with the reason in tests/mutation_equivalent.txt) leave the
denominator. Prints a table and the survivors; exits 1 when the total is under --target.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

KILLED = {"killed", "timeout"}
SURVIVED = {"survived", "no tests"}
LINE = re.compile(r"^\s*(?P<name>[\w.]+)__mutmut_\d+: (?P<status>.+)$")
EQUIVALENT = Path(__file__).resolve().parents[1] / "tests" / "mutation_equivalent.txt"


def equivalent_mutants(path: Path = EQUIVALENT) -> set[str]:
    """Mutant names from the review file: ``name  # reason`` lines (blank and # lines skipped)."""
    if not path.exists():
        return set()
    names = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {name for name in names if name}


def module_of(function: str) -> str:
    # aiayn.inference.search.x_beam_search or aiayn.inference.search.xǁ_RunǁstepǁNone
    return re.split(r"\.x_|\.xǁ", function, maxsplit=1)[0]


def tally(lines: list[str], equivalent: set[str]) -> tuple[dict[str, Counter], list[str]]:
    per_module: dict[str, Counter] = {}
    survivors = []
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        mutant = line.split(":", 1)[0].strip()
        status = m["status"].strip()
        counts = per_module.setdefault(module_of(m["name"]), Counter())
        if mutant in equivalent:
            counts["equivalent"] += 1
        elif status in KILLED:
            counts["killed"] += 1
        elif status in SURVIVED:
            counts["survived"] += 1
            survivors.append(f"{mutant}: {status}")
        else:
            counts["other"] += 1  # not checked yet, suspicious, skipped
            survivors.append(f"{mutant}: {status}")
    return per_module, survivors


def score(c: Counter) -> float:
    judged = c["killed"] + c["survived"] + c["other"]
    return 100.0 * c["killed"] / judged if judged else 100.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=float, default=85.0, help="minimum total score (percent)")
    args = ap.parse_args()
    per_module, survivors = tally(sys.stdin.read().splitlines(), equivalent_mutants())
    total: Counter = Counter()
    print(f"{'module':<34} {'mutants':>7} {'killed':>6} {'equiv':>5} {'survived':>8} {'score':>6}")
    for module, c in sorted(per_module.items()):
        total.update(c)
        print(f"{module:<34} {sum(c.values()):>7} {c['killed']:>6} {c['equivalent']:>5} "
              f"{c['survived'] + c['other']:>8} {score(c):>5.1f}%")
    print(f"{'total':<34} {sum(total.values()):>7} {total['killed']:>6} {total['equivalent']:>5} "
          f"{total['survived'] + total['other']:>8} {score(total):>5.1f}%")
    if survivors:
        print("\nsurvivors (mutmut show NAME):\n  " + "\n  ".join(survivors))
    return 0 if score(total) >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
