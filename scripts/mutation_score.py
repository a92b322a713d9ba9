"""The mutation score per module from ``mutmut results --all true`` (read on stdin), and the
check of the reviewed-mutant list against the code.

A mutant counts as killed when a test failed or timed out on it; as survived when the tests
passed on it or none covered it. tests/mutation_equivalent.txt lists the reviewed survivors,
one a line::

    MUTANT_NAME  src=HASH  [device-only]  # the reason

``HASH`` fingerprints the mutated function's source as it was reviewed (its syntax tree, so
comments and blank lines do not count): mutmut numbers a function's mutants in
order, so an edit to the function renumbers them and the reviewed name may now denote another
mutant. An *equivalent* mutant (no test can tell it from the original) leaves the denominator;
a *device-only* one (it differs only on an accelerator, and the suite runs on the CPU) stays a
survivor, counted in its own column.

Modes:
  (stdin)          score per module; exit 1 when the list is stale, when a listed mutant was
                   killed or is absent from the results, or when the total is under --target.
  --check-list     names and hashes only (no mutants run): exit 1 when an entry names a module
                   not mutated, a function that does not exist, or a function whose source
                   changed since its review.
  --relocate       rewrite the module path of entries whose function now lives in another
                   module (the one with the same source, else the one function of that name
                   when it left its module); then check.
  --add-hashes     write ``src=HASH`` to entries that have none (``device-only`` too where the
                   reason says only a CUDA run could tell); for a list converted by hand or
                   merged from a branch without hashes. Review the entries first: this trusts them.
  --show-stale     print, for each entry whose function changed, the mutant that name denotes
                   now beside the listed reason (needs mutmut 3.8.1 importable; mutants are
                   generated, not run): to review them before deleting their src= and running
                   --add-hashes, or deleting the entry.
  --record         (with stdin) also write the results of each module whose mutants all ran to
                   tests/mutation_results.json: its mutant count, how many were killed, the
                   names of the survivors and of the mutants not run. A module with a mutant
                   not checked (a run of some of its functions only) keeps its recorded results.
  --table          print the score table of docs/testing.md (markdown) from the recorded
                   results and the reviewed list; exit 1 when a mutated module has no recorded
                   results or a recorded one is not mutated.
  --update-docs    write that table into docs/testing.md in place of the one there.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]
KILLED = {"killed", "timeout"}
SURVIVED = {"survived", "no tests"}
NOT_RUN = {"skipped"}
# A module with a mutant in one of these states was not run in full: its results are not recorded.
UNFINISHED = {"not checked", "check was interrupted by user"}
LINE = re.compile(r"^\s*(?P<name>[\w.]+)__mutmut_\d+: (?P<status>.+)$")
EQUIVALENT = REPO / "tests" / "mutation_equivalent.txt"
RESULTS = REPO / "tests" / "mutation_results.json"
DOCS = REPO / "docs" / "testing.md"
SRC = REPO / "src"
DEVICE_ONLY = "device-only"
# A reason that says the mutant differs only off the CPU (written by --add-hashes as device-only).
DEVICE_REASON = re.compile(r"only a CUDA run could tell|only an accelerator run", re.IGNORECASE)


@dataclass
class Entry:
    name: str
    digest: str | None
    device_only: bool
    reason: str
    line: int  # 1-based line in the list file

    @property
    def module(self) -> str:
        return module_of(self.name.rsplit("__mutmut_", 1)[0])

    @property
    def qualname(self) -> str:
        return qualname_of(self.name)

    def render(self) -> str:
        fields = [self.name]
        if self.digest:
            fields.append(f"src={self.digest}")
        if self.device_only:
            fields.append(DEVICE_ONLY)
        return "  ".join(fields) + (f"  # {self.reason}" if self.reason else "")


def module_of(function: str) -> str:
    # aiayn.inference.search.x_beam_search or aiayn.inference.search.xǁ_Runǁstep
    return re.split(r"\.x_|\.xǁ", function, maxsplit=1)[0]


def qualname_of(mutant: str) -> str:
    """``aiayn.m.x_f__mutmut_3`` -> ``f``; ``aiayn.m.xǁCǁmeth__mutmut_3`` -> ``C.meth``."""
    base = mutant.rsplit("__mutmut_", 1)[0]
    mangled = base[len(module_of(base)) + 1:]
    if mangled.startswith("xǁ"):
        return ".".join(mangled[2:].split("ǁ"))
    return mangled.removeprefix("x_")


def parse_entry(text: str, line: int) -> Entry | None:
    body, _, reason = text.partition("#")
    fields = body.split()
    if not fields:
        return None
    digest, device_only = None, False
    for field in fields[1:]:
        if field.startswith("src="):
            digest = field[4:]
        elif field == DEVICE_ONLY:
            device_only = True
        else:
            raise ValueError(f"line {line}: unknown field {field!r} (expected src=HASH or "
                             f"{DEVICE_ONLY})")
    return Entry(fields[0], digest, device_only, reason.strip(), line)


def read_entries(path: Path = EQUIVALENT) -> list[Entry]:
    if not path.exists():
        return []
    entries = []
    for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        entry = parse_entry(text, i)
        if entry is not None:
            entries.append(entry)
    return entries


def equivalent_mutants(path: Path = EQUIVALENT) -> set[str]:
    """Names of the listed mutants that leave the denominator (device-only ones do not)."""
    return {e.name for e in read_entries(path) if not e.device_only}


# --- the functions' fingerprints

def source_digest(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """12 hex digits of the function's syntax tree (positions and comments left out): the
    fingerprint mutmut 3.8 itself keeps of each mutated function."""
    return hashlib.sha256(ast.dump(node, annotate_fields=False).encode()).hexdigest()[:12]


def functions_of(tree: ast.Module) -> dict[str, str]:
    """Qualified name -> digest of the module's functions and its classes' methods (what mutmut
    mutates: top-level functions and the methods of top-level classes)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = source_digest(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[f"{node.name}.{item.name}"] = source_digest(item)
    return found


def module_file(module: str, src: Path) -> Path | None:
    base = src.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


class SourceIndex:
    """The functions of every module under ``src``, parsed once."""

    def __init__(self, src: Path) -> None:
        self.src = src
        self._modules: dict[str, dict[str, str] | None] = {}

    def functions(self, module: str) -> dict[str, str] | None:
        if module not in self._modules:
            path = module_file(module, self.src)
            self._modules[module] = (functions_of(ast.parse(path.read_text(encoding="utf-8")))
                                     if path else None)
        return self._modules[module]

    def all_modules(self) -> list[str]:
        modules = []
        for path in sorted(self.src.rglob("*.py")):
            parts = path.relative_to(self.src).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        return modules


def mutated_modules(pyproject: Path) -> set[str] | None:
    """Module names of [tool.mutmut] only_mutate (None: no such list, anything goes)."""
    if not pyproject.is_file():
        return None
    paths = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get(
        "mutmut", {}).get("only_mutate")
    if not paths:
        return None
    modules = set()
    for p in paths:
        parts = Path(p).with_suffix("").parts
        parts = parts[1:] if parts[0] == "src" else parts
        modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def check_list(entries: list[Entry], index: SourceIndex,
               mutated: set[str] | None = None) -> list[str]:
    """One message per stale or malformed entry (empty: the list matches the code)."""
    problems = []
    seen: dict[str, int] = {}
    for e in entries:
        where = f"line {e.line}: {e.name}"
        if e.name in seen:
            problems.append(f"{where}: listed twice (also line {seen[e.name]})")
        seen[e.name] = e.line
        if "__mutmut_" not in e.name:
            problems.append(f"{where}: not a mutmut name (MODULE.x_FUNC__mutmut_N)")
            continue
        if not e.reason:
            problems.append(f"{where}: no reason (# why no test can tell it)")
        if mutated is not None and e.module not in mutated:
            problems.append(f"{where}: module {e.module} is not in [tool.mutmut] only_mutate")
        functions = index.functions(e.module)
        if functions is None:
            problems.append(f"{where}: module {e.module} not found under {index.src}")
        elif e.qualname not in functions:
            problems.append(f"{where}: {e.qualname} not found in {e.module}")
        elif e.digest is None:
            problems.append(f"{where}: no src=HASH (review it, then --add-hashes)")
        elif functions[e.qualname] != e.digest:
            problems.append(f"{where}: {e.qualname} changed since the review (src="
                            f"{functions[e.qualname]}, listed {e.digest}): its mutants are "
                            f"renumbered; re-run make mutation and review the entry again")
    return problems


def relocate(entries: list[Entry], index: SourceIndex) -> list[str]:
    """Move entries whose function is not (or no longer the same) in its module: to the one
    module that now has a function of that name with the listed source; failing that, when
    the function is gone from its module, to the one module that has a function of that name
    (the check then says whether its source changed). Returns the moves."""
    by_source: dict[tuple[str, str], list[str]] = {}
    by_name: dict[str, list[str]] = {}
    for module in index.all_modules():
        for qualname, digest in (index.functions(module) or {}).items():
            by_source.setdefault((qualname, digest), []).append(module)
            by_name.setdefault(qualname, []).append(module)
    moves = []
    for e in entries:
        if "__mutmut_" not in e.name:
            continue
        functions = index.functions(e.module) or {}
        if e.qualname in functions and functions[e.qualname] == e.digest:
            continue
        homes = by_source.get((e.qualname, e.digest), []) if e.digest else []
        if not homes and e.qualname not in functions:
            homes = by_name.get(e.qualname, [])
        if len(homes) == 1 and homes[0] != e.module:
            new = homes[0] + e.name[len(e.module):]
            moves.append(f"line {e.line}: {e.name} -> {new}")
            e.name = new
    return moves


def add_hashes(entries: list[Entry], index: SourceIndex) -> list[str]:
    added = []
    for e in entries:
        if e.digest is not None or "__mutmut_" not in e.name:
            continue
        digest = (index.functions(e.module) or {}).get(e.qualname)
        if digest is None:
            continue  # reported by the check
        e.digest = digest
        e.device_only = e.device_only or bool(DEVICE_REASON.search(e.reason))
        added.append(f"line {e.line}: {e.name} src={digest}"
                     + (f" {DEVICE_ONLY}" if e.device_only else ""))
    return added


def rewrite(path: Path, entries: list[Entry]) -> None:
    """Write the entries back on their own lines; comments and blank lines stay as they are."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for e in entries:
        lines[e.line - 1] = e.render()
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def mutant_diffs(src: Path, names: set[str]) -> dict[str, list[str]]:
    """Mutant name -> the lines it changes (``-`` original, ``+`` mutant), generated by
    mutmut 3.8 from the current source (no test is run)."""
    import difflib

    from mutmut.mutation.file_mutation import mutate_file_contents  # type: ignore[import-not-found]

    diffs: dict[str, list[str]] = {}
    for module in sorted({module_of(n.rsplit("__mutmut_", 1)[0]) for n in names}):
        path = module_file(module, src)
        if path is None:
            continue
        mutated = mutate_file_contents(str(path), path.read_text(encoding="utf-8"))
        functions = {node.name: ast.unparse(node).splitlines()[1:] for node in ast.walk(ast.parse(mutated.code))
                     if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
        for short in mutated.mutant_names:
            name = f"{module}.{short}"
            original = functions.get(short.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
            if name in names and original is not None and short in functions:
                diffs[name] = [line for line in difflib.unified_diff(
                    [x.strip() for x in original], [x.strip() for x in functions[short]], lineterm="", n=0)
                    if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    return diffs


def show_stale(entries: list[Entry], index: SourceIndex) -> None:
    stale = {e.name: e for e in entries
             if e.digest and (index.functions(e.module) or {}).get(e.qualname) not in (None, e.digest)}
    diffs = mutant_diffs(index.src, set(stale))
    for name, e in stale.items():
        print(f"line {e.line}: {name}\n  listed: {e.reason}")
        for line in diffs.get(name, ["  (no such mutant now)"]):
            print(f"  {line}")


# --- the score

def tally(lines: list[str], equivalent: set[str],
          device_only: frozenset[str] = frozenset()) -> tuple[dict[str, Counter], list[str]]:
    per_module: dict[str, Counter] = {}
    survivors = []
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        mutant = line.split(":", 1)[0].strip()
        status = m["status"].strip()
        counts = per_module.setdefault(module_of(m["name"]), Counter())
        if status in KILLED:
            counts["killed"] += 1
        elif mutant in equivalent and status in SURVIVED:
            counts["equivalent"] += 1
        elif mutant in device_only and status in SURVIVED:
            counts["device"] += 1
        elif status in SURVIVED:
            counts["survived"] += 1
            survivors.append(f"{mutant}: {status}")
        else:
            counts["other"] += 1  # not checked yet, suspicious, skipped
            survivors.append(f"{mutant}: {status}")
    return per_module, survivors


def listed_but_not_survived(lines: list[str], listed: set[str]) -> list[str]:
    """Listed mutants that a test killed, or that the results do not have at all."""
    status = {}
    for line in lines:
        if LINE.match(line):
            name, _, st = line.partition(":")
            status[name.strip()] = st.strip()
    problems = []
    for name in sorted(listed):
        if name not in status:
            problems.append(f"{name}: listed but not in the results (renumbered or removed)")
        elif status[name] in KILLED:
            problems.append(f"{name}: listed but {status[name]} (a test tells it apart: "
                            "remove the entry)")
    return problems


def score(c: Counter) -> float:
    judged = c["killed"] + c["survived"] + c["other"] + c["device"]
    return 100.0 * c["killed"] / judged if judged else 100.0


def print_table(per_module: dict[str, Counter]) -> Counter:
    total: Counter = Counter()
    print(f"{'module':<34} {'mutants':>7} {'killed':>6} {'equiv':>5} {'device':>6} "
          f"{'survived':>8} {'score':>6}")
    rows = sorted(per_module.items()) + [("total", total)]
    for module, c in rows:
        if module != "total":
            total.update(c)
        print(f"{module:<34} {sum(c.values()):>7} {c['killed']:>6} {c['equivalent']:>5} "
              f"{c['device']:>6} {c['survived'] + c['other']:>8} {percent(score(c)):>6}")
    return total


# --- the recorded results and the table of docs/testing.md

def read_results(path: Path = RESULTS) -> dict[str, dict]:
    """Module -> its last full run: ``{"mutants", "killed", "survived": [names], "not_run": [names]}``."""
    if not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _mutant_order(name: str) -> tuple[str, int]:
    base, _, number = name.rpartition("__mutmut_")
    return base, int(number)


def record_results(lines: list[str], path: Path = RESULTS,
                   mutated: set[str] | None = None) -> tuple[list[str], list[str]]:
    """Write the results of the modules whose mutants all ran into ``path``, the other
    modules' records kept. ``mutmut results --all true`` lists every mutant of every module
    it mutates (``mutated``, from the same ``[tool.mutmut]``), run or not: a mutated module
    absent from a listing that is not empty has no mutants (Protocol declarations only) and
    is recorded with none. Returns the modules recorded, and one line per module left as it
    was (some of its mutants not checked)."""
    statuses: dict[str, dict[str, str]] = {}
    for line in lines:
        m = LINE.match(line)
        if m:
            statuses.setdefault(module_of(m["name"]), {})[line.split(":", 1)[0].strip()] = m["status"].strip()
    if statuses:
        statuses.update({module: {} for module in sorted(mutated or ()) if module not in statuses})
    results = read_results(path)
    recorded, kept = [], []
    for module, by_name in sorted(statuses.items()):
        unfinished = sum(status in UNFINISHED for status in by_name.values())
        if unfinished:
            kept.append(f"{module}: {unfinished} of {len(by_name)} mutants not checked, its results not recorded")
            continue
        results[module] = {
            "mutants": len(by_name),
            "killed": sum(status in KILLED for status in by_name.values()),
            "survived": sorted((n for n, st in by_name.items() if st not in KILLED | NOT_RUN), key=_mutant_order),
            "not_run": sorted((n for n, st in by_name.items() if st in NOT_RUN), key=_mutant_order),
        }
        recorded.append(module)
    path.write_text(json.dumps(dict(sorted(results.items())), indent=1, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    return recorded, kept


TABLE_HEAD = ("| module | mutants | killed | equivalent | device-only | surviving | not run | score |",
              "|---|---:|---:|---:|---:|---:|---:|---:|")
COLUMNS = ("mutants", "killed", "equivalent", "device", "surviving", "not_run")


def percent(value: float) -> str:
    """A score rounded down to one decimal: 100.0% only when every judged mutant died."""
    return f"{math.floor(value * 10) / 10:.1f}%"


def table_score(c: Counter) -> str:
    """killed / (mutants - equivalent), as :func:`score` counts it."""
    judged = c["mutants"] - c["equivalent"]
    return percent(100.0 * c["killed"] / judged if judged else 100.0)


def table_lines(results: dict[str, dict], entries: list[Entry]) -> list[str]:
    """The markdown table: one row per recorded module (its path under the package), then the
    total. A recorded survivor is equivalent or device-only as the reviewed list says now."""
    equivalent = {e.name for e in entries if not e.device_only}
    device = {e.name for e in entries if e.device_only}
    rows = []
    total: Counter = Counter()
    for module, r in results.items():
        survived = set(r["survived"])
        c = Counter(mutants=r["mutants"], killed=r["killed"], equivalent=len(survived & equivalent),
                    device=len(survived & device), not_run=len(r["not_run"]))
        c["surviving"] = len(survived) - c["equivalent"] - c["device"]
        total.update(c)
        label = "/".join(module.split(".")[1:]) + ".py"
        rows.append((label, "| " + " | ".join([label, *(f"{c[k]:,}" for k in COLUMNS), table_score(c)]) + " |"))
    bold = ["**total**", *(f"**{total[k]:,}**" for k in COLUMNS), f"**{table_score(total)}**"]
    return [*TABLE_HEAD, *(row for _, row in sorted(rows)), "| " + " | ".join(bold) + " |"]


def table_problems(results: dict[str, dict], mutated: set[str] | None) -> list[str]:
    problems = [f"{m}: recorded but not in [tool.mutmut] only_mutate" for m in sorted(results)
                if mutated is not None and m not in mutated]
    return problems + [f"{m}: in [tool.mutmut] only_mutate but no results recorded (make mutation)"
                       for m in sorted(mutated or ()) if m not in results]


def docs_table(text: str) -> tuple[int, int]:
    """The line range [start, end) of the score table in the docs' text."""
    lines = text.splitlines()
    if TABLE_HEAD[0] not in lines:
        raise ValueError(f"no table headed {TABLE_HEAD[0]!r}")
    start = end = lines.index(TABLE_HEAD[0])
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return start, end


def update_docs(path: Path, table: list[str]) -> bool:
    """Put ``table`` in place of the score table in ``path``; whether anything changed."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    start, end = docs_table(text)
    new = "\n".join(lines[:start] + table + lines[end:]) + "\n"
    path.write_text(new, encoding="utf-8")
    return new != text


def report(problems: list[str], what: str) -> None:
    print(f"{len(problems)} {what}:\n  " + "\n  ".join(problems), file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=float, default=85.0, help="minimum total score (percent)")
    ap.add_argument("--list", type=Path, default=EQUIVALENT, help="the reviewed-mutant list")
    ap.add_argument("--src", type=Path, default=SRC, help="the source tree mutmut mutates")
    ap.add_argument("--pyproject", type=Path, default=REPO / "pyproject.toml")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the recorded results (JSON)")
    ap.add_argument("--docs", type=Path, default=DOCS, help="the page whose score table --update-docs writes")
    ap.add_argument("--record", action="store_true",
                    help="with results on stdin: record the modules run in full in --results")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check-list", action="store_true",
                      help="check names and hashes against the source only (no results read)")
    mode.add_argument("--relocate", action="store_true",
                      help="rewrite entries whose function moved to another module, then check")
    mode.add_argument("--add-hashes", action="store_true",
                      help="write src=HASH to entries without one, then check")
    mode.add_argument("--show-stale", action="store_true",
                      help="print the mutant each changed entry now names (needs mutmut)")
    mode.add_argument("--table", action="store_true",
                      help="print the score table from the recorded results (no mutant run)")
    mode.add_argument("--update-docs", action="store_true",
                      help="write the score table into --docs")
    return ap


def _table(args: argparse.Namespace, entries: list[Entry]) -> int:
    results = read_results(args.results)
    table = table_lines(results, entries)
    if args.update_docs:
        changed = update_docs(args.docs, table)
        print(f"{args.docs}: score table {'rewritten' if changed else 'unchanged'}")
    else:
        print("\n".join(table))
    problems = table_problems(results, mutated_modules(args.pyproject))
    if problems:
        report(problems, f"modules without matching results in {args.results}")
        return 1
    return 0


def _score(args: argparse.Namespace, entries: list[Entry], problems: list[str]) -> int:
    lines = sys.stdin.read().splitlines()
    if args.record:
        recorded, kept = record_results(lines, args.results, mutated_modules(args.pyproject))
        print(f"{args.results.name}: recorded {len(recorded)} modules" + "".join(f"\n  {k}" for k in kept))
    problems += listed_but_not_survived(lines, {e.name for e in entries})
    per_module, survivors = tally(lines, {e.name for e in entries if not e.device_only},
                                  frozenset(e.name for e in entries if e.device_only))
    total = print_table(per_module)
    if survivors:
        print("\nsurvivors (mutmut show NAME):\n  " + "\n  ".join(survivors))
    device = sorted(e.name for e in entries if e.device_only)
    if device:
        print(f"\ndevice-only survivors ({len(device)}: differ only on an accelerator):\n  "
              + "\n  ".join(device))
    if problems:
        report(problems, f"stale entries in {args.list}")
        return 1
    return 0 if score(total) >= args.target else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    entries = read_entries(args.list)
    if args.table or args.update_docs:
        return _table(args, entries)
    index = SourceIndex(args.src)
    if args.show_stale:
        show_stale(entries, index)
        return 0
    if args.relocate or args.add_hashes:
        changes = relocate(entries, index) if args.relocate else add_hashes(entries, index)
        if changes:
            rewrite(args.list, entries)
        print(f"{len(changes)} entries rewritten" + "".join(f"\n  {c}" for c in changes))
    problems = check_list(entries, index, mutated_modules(args.pyproject))
    if args.check_list or args.relocate or args.add_hashes:
        if problems:
            report(problems, f"stale entries in {args.list}")
            return 1
        print(f"{args.list.name}: {len(entries)} entries match the source")
        return 0
    return _score(args, entries, problems)


if __name__ == "__main__":
    sys.exit(main())
