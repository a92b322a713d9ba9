"""scripts/mutation_score.py: the score per module from `mutmut results --all true`, and the
check of tests/mutation_equivalent.txt against the source (names and source hashes)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import mutation_score as score_mod
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "mutation_score.py"

RESULTS = """\
    pkg.example.schedule.x_noam_lr__mutmut_1: killed
    pkg.example.schedule.x_noam_lr__mutmut_2: survived
    pkg.example.schedule.x_constant_lr__mutmut_1: survived
    pkg.example.schedule.x_constant_lr__mutmut_2: timeout
    pkg.example.io.xǁCheckpointManagerǁprune__mutmut_3: no tests
    pkg.example.io.xǁCheckpointManagerǁprune__mutmut_4: killed
    pkg.example.io.x_save_optimizer__mutmut_9: not checked
"""

SCHEDULE = '''\
import math


def noam_lr(step, warmup):
    """The paper's schedule."""
    return min(step ** -0.5, step * warmup ** -1.5)


def constant_lr(step, peak_lr, warmup=0):
    return peak_lr
'''

IO = '''\
class CheckpointManager:
    def prune(self, keep):
        return keep[:1]


def save_optimizer(state):
    return dict(state)
'''


def _digest(source: str, qualname: str) -> str:
    return score_mod.functions_of(ast.parse(source))[qualname]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A source tree ``src/pkg/example/{schedule,io}.py`` and a pyproject mutating both."""
    pkg = tmp_path / "src" / "pkg" / "example"
    pkg.mkdir(parents=True)
    (pkg / "schedule.py").write_text(SCHEDULE)
    (pkg / "io.py").write_text(IO)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nonly_mutate = ["src/pkg/example/schedule.py", "src/pkg/example/io.py"]\n')
    return tmp_path


def _listing(tree: Path, *lines: str) -> Path:
    path = tree / "equivalent.txt"
    path.write_text("# reviewed mutants\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(tree: Path, listing: Path, *args: str, results: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--list", str(listing), "--src",
                           str(tree / "src"), "--pyproject", str(tree / "pyproject.toml"), *args],
                          input=results, capture_output=True, text=True)


def _good_entry() -> str:
    return (f"pkg.example.schedule.x_constant_lr__mutmut_1  src={_digest(SCHEDULE, 'constant_lr')}"
            "  # the default warmup is never read")


def test_modules_statuses_and_equivalents_are_tallied() -> None:
    per_module, survivors = score_mod.tally(
        RESULTS.splitlines(), {"pkg.example.schedule.x_constant_lr__mutmut_1"},
        frozenset({"pkg.example.io.xǁCheckpointManagerǁprune__mutmut_3"}))
    assert per_module == {
        "pkg.example.schedule": Counter(killed=2, survived=1, equivalent=1),
        "pkg.example.io": Counter(killed=1, device=1, other=1),
    }
    assert survivors == ["pkg.example.schedule.x_noam_lr__mutmut_2: survived",
                         "pkg.example.io.x_save_optimizer__mutmut_9: not checked"]
    # Equivalent mutants leave the denominator; device-only ones stay in it as survivors;
    # timeouts count as killed.
    assert score_mod.score(per_module["pkg.example.schedule"]) == 100 * 2 / 3
    assert score_mod.score(per_module["pkg.example.io"]) == 100 * 1 / 3


def test_the_review_file_lists_names_hashes_markers_and_reasons(tmp_path: Path) -> None:
    review = tmp_path / "equivalent.txt"
    review.write_text("# header\n\na.b.x_f__mutmut_1  src=0123456789ab  # the default is unused\n"
                      "a.b.x_g__mutmut_2  src=ba9876543210  device-only  # only a CUDA run\n")
    first, second = score_mod.read_entries(review)
    assert (first.name, first.digest, first.device_only, first.reason, first.line) == (
        "a.b.x_f__mutmut_1", "0123456789ab", False, "the default is unused", 3)
    assert (second.device_only, second.qualname, second.module) == (True, "g", "a.b")
    assert score_mod.equivalent_mutants(review) == {"a.b.x_f__mutmut_1"}
    assert score_mod.equivalent_mutants(tmp_path / "absent.txt") == set()
    assert score_mod.qualname_of("a.b.xǁ_Runǁ__init____mutmut_7") == "_Run.__init__"
    review.write_text("a.b.x_f__mutmut_1  sha=1  # a typo in the field\n")
    with pytest.raises(ValueError, match="line 1: unknown field 'sha=1'"):
        score_mod.read_entries(review)


def test_the_hash_is_mutmuts_fingerprint_of_the_function() -> None:
    # mutmut 3.8 keeps sha256(ast.dump(node, annotate_fields=False))[:12] per mutated function.
    import hashlib
    node = ast.parse(SCHEDULE).body[1]
    assert _digest(SCHEDULE, "noam_lr") == hashlib.sha256(
        ast.dump(node, annotate_fields=False).encode()).hexdigest()[:12]
    # Comments and blank lines do not count; a changed expression does.
    assert _digest(SCHEDULE.replace("    return peak_lr", "    # fixed\n\n    return peak_lr"),
                   "constant_lr") == _digest(SCHEDULE, "constant_lr")
    assert _digest(SCHEDULE.replace("return peak_lr", "return peak_lr * 1"),
                   "constant_lr") != _digest(SCHEDULE, "constant_lr")


def test_a_current_list_passes_the_check(tree: Path) -> None:
    method = _digest(IO, "CheckpointManager.prune")
    listing = _listing(tree, _good_entry(),
                       f"pkg.example.io.xǁCheckpointManagerǁprune__mutmut_3  src={method}  "
                       "device-only  # only a CUDA run could tell")
    done = _run(tree, listing, "--check-list")
    assert (done.returncode, done.stderr) == (0, "")
    assert "2 entries match the source" in done.stdout


@pytest.mark.parametrize(("entry", "message"), [
    ("pkg.example.schedule.x_constant_lr__mutmut_1  src=0123456789ab  # reviewed long ago",
     "constant_lr changed since the review"),
    ("pkg.example.schedule.x_linear_lr__mutmut_1  src=0123456789ab  # a function since removed",
     "linear_lr not found in pkg.example.schedule"),
    ("pkg.example.gone.x_f__mutmut_1  src=0123456789ab  # a module since removed",
     "module pkg.example.gone is not in [tool.mutmut] only_mutate"),
    ("pkg.example.schedule.x_constant_lr__mutmut_1  # listed without a hash",
     "no src=HASH"),
    ("pkg.example.schedule.x_constant_lr__mutmut_1  src=" + _digest(SCHEDULE, "constant_lr"),
     "no reason"),
])
def test_a_stale_entry_fails_the_check(tree: Path, entry: str, message: str) -> None:
    done = _run(tree, _listing(tree, entry), "--check-list")
    assert done.returncode == 1
    assert f"line 3: {entry.split()[0]}: " in done.stderr and message in done.stderr


def test_an_edit_to_a_listed_function_fails_the_check(tree: Path) -> None:
    listing = _listing(tree, _good_entry())
    assert _run(tree, listing, "--check-list").returncode == 0
    schedule = tree / "src" / "pkg" / "example" / "schedule.py"
    schedule.write_text(SCHEDULE.replace("return peak_lr", "return peak_lr if warmup else 0.0"))
    done = _run(tree, listing, "--check-list")
    assert done.returncode == 1
    assert "constant_lr changed since the review" in done.stderr
    assert "re-run make mutation and review the entry again" in done.stderr


def test_a_listed_mutant_that_was_killed_or_is_absent_fails_the_score(tree: Path) -> None:
    noam = _digest(SCHEDULE, "noam_lr")
    listing = _listing(tree, _good_entry(),
                       f"pkg.example.schedule.x_noam_lr__mutmut_1  src={noam}  # claimed equivalent")
    # Without the listed names in the results: absent; x_noam_lr__mutmut_1 is killed in RESULTS.
    done = _run(tree, listing, "--target", "0", results=RESULTS)
    assert done.returncode == 1
    assert ("pkg.example.schedule.x_noam_lr__mutmut_1: listed but killed (a test tells it apart"
            in done.stderr)
    only_noam = "\n".join(line for line in RESULTS.splitlines() if "constant_lr" not in line)
    done = _run(tree, listing, "--target", "0", results=only_noam)
    assert "x_constant_lr__mutmut_1: listed but not in the results" in done.stderr
    # The same list with the killed entry gone passes.
    ok = _run(tree, _listing(tree, _good_entry()), "--target", "0", results=RESULTS)
    assert (ok.returncode, ok.stderr) == (0, "")


def test_the_exit_code_follows_the_target(tree: Path) -> None:
    listing = _listing(tree, _good_entry())
    low, high = (_run(tree, listing, "--target", t, results=RESULTS) for t in ("40", "60"))
    # 3 killed of 6 judged (x_constant_lr__mutmut_1 is equivalent).
    assert (low.returncode, high.returncode) == (0, 1)
    assert low.stdout.splitlines()[3].split() == ["total", "7", "3", "1", "0", "3", "50.0%"]


def test_device_only_mutants_are_survivors_with_their_own_count(tree: Path) -> None:
    method = _digest(IO, "CheckpointManager.prune")
    listing = _listing(tree, _good_entry(),
                       f"pkg.example.io.xǁCheckpointManagerǁprune__mutmut_3  src={method}  "
                       "device-only  # only a CUDA run could tell")
    done = _run(tree, listing, "--target", "0", results=RESULTS)
    assert done.returncode == 0
    io_row = next(line for line in done.stdout.splitlines() if line.startswith("pkg.example.io"))
    assert io_row.split() == ["pkg.example.io", "3", "1", "0", "1", "1", "33.3%"]
    assert "device-only survivors (1: differ only on an accelerator)" in done.stdout


def test_relocate_follows_a_function_moved_to_another_module(tree: Path) -> None:
    listing = _listing(tree, _good_entry(), "# a comment stays")
    pkg = tree / "src" / "pkg" / "example"
    (pkg / "rates.py").write_text("def constant_lr(step, peak_lr, warmup=0):\n    return peak_lr\n")
    (pkg / "schedule.py").write_text(SCHEDULE.split("def constant_lr")[0])
    (tree / "pyproject.toml").write_text(
        '[tool.mutmut]\nonly_mutate = ["src/pkg/example/rates.py", "src/pkg/example/io.py"]\n')
    assert "constant_lr not found" in _run(tree, listing, "--check-list").stderr
    done = _run(tree, listing, "--relocate")
    assert done.returncode == 0, done.stderr
    assert ("pkg.example.schedule.x_constant_lr__mutmut_1 -> pkg.example.rates.x_constant_lr"
            "__mutmut_1") in done.stdout
    assert listing.read_text().splitlines()[2:] == [
        _good_entry().replace(".schedule.", ".rates."), "# a comment stays"]


def test_relocate_follows_a_moved_and_edited_function_and_the_check_flags_it(tree: Path) -> None:
    listing = _listing(tree, _good_entry())
    pkg = tree / "src" / "pkg" / "example"
    (pkg / "rates.py").write_text("def constant_lr(step, peak_lr, warmup=0):\n    return peak_lr * 2\n")
    (pkg / "schedule.py").write_text(SCHEDULE.split("def constant_lr")[0])
    (tree / "pyproject.toml").write_text(
        '[tool.mutmut]\nonly_mutate = ["src/pkg/example/rates.py", "src/pkg/example/io.py"]\n')
    done = _run(tree, listing, "--relocate")
    assert "-> pkg.example.rates.x_constant_lr__mutmut_1" in done.stdout
    assert done.returncode == 1 and "constant_lr changed since the review" in done.stderr


def test_add_hashes_fills_entries_without_one(tree: Path) -> None:
    listing = _listing(tree, "pkg.example.schedule.x_constant_lr__mutmut_1  # the default is unused",
                       "pkg.example.io.x_save_optimizer__mutmut_9  # equivalent on the CPU "
                       "(only a CUDA run could tell)")
    done = _run(tree, listing, "--add-hashes")
    assert done.returncode == 0, done.stderr
    assert listing.read_text().splitlines()[2:] == [
        f"pkg.example.schedule.x_constant_lr__mutmut_1  src={_digest(SCHEDULE, 'constant_lr')}"
        "  # the default is unused",
        f"pkg.example.io.x_save_optimizer__mutmut_9  src={_digest(IO, 'save_optimizer')}  "
        "device-only  # equivalent on the CPU (only a CUDA run could tell)"]


def test_the_repository_list_matches_the_source() -> None:
    """tests/mutation_equivalent.txt as committed: every entry names a mutated module, an
    existing function, and that function's current source."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--check-list"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_show_stale_prints_what_a_changed_entry_names_now(tree: Path, monkeypatch, capsys) -> None:
    listing = _listing(tree, "pkg.example.schedule.x_constant_lr__mutmut_1  src=0123456789ab  # the default is unused")
    seen = []

    def diffs(src: Path, names: set[str]) -> dict[str, list[str]]:  # mutmut's generator, scripted
        seen.append((src, names))
        return {"pkg.example.schedule.x_constant_lr__mutmut_1": ["-return peak_lr", "+return None"]}

    monkeypatch.setattr(score_mod, "mutant_diffs", diffs)
    assert score_mod.main(["--list", str(listing), "--src", str(tree / "src"), "--show-stale"]) == 0
    assert seen == [(tree / "src", {"pkg.example.schedule.x_constant_lr__mutmut_1"})]
    assert capsys.readouterr().out.splitlines() == [
        "line 3: pkg.example.schedule.x_constant_lr__mutmut_1", "  listed: the default is unused",
        "  -return peak_lr", "  +return None"]


# --- the recorded results and the table of docs/testing.md

def test_record_writes_the_modules_run_in_full_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    earlier = {"mutants": 9, "killed": 8, "survived": ["pkg.example.io.x_save_optimizer__mutmut_2"], "not_run": []}
    path.write_text(json.dumps({"pkg.example.io": earlier, "pkg.old": earlier}))
    recorded, kept = score_mod.record_results(
        RESULTS.splitlines() + ["    pkg.example.schedule.x_noam_lr__mutmut_10: skipped",
                                "    pkg.example.schedule.x_noam_lr__mutmut_3: no tests"], path)
    # io has a mutant not checked (a run of some functions only): its earlier record stays.
    assert recorded == ["pkg.example.schedule"]
    assert kept == ["pkg.example.io: 1 of 3 mutants not checked, its results not recorded"]
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "pkg.example.io": earlier, "pkg.old": earlier,
        "pkg.example.schedule": {
            "mutants": 6, "killed": 2,  # a timeout is a kill
            "survived": ["pkg.example.schedule.x_constant_lr__mutmut_1",  # functions, then numbers
                         "pkg.example.schedule.x_noam_lr__mutmut_2", "pkg.example.schedule.x_noam_lr__mutmut_3"],
            "not_run": ["pkg.example.schedule.x_noam_lr__mutmut_10"]}}



def test_a_mutated_module_absent_from_the_listing_is_recorded_without_mutants(tmp_path: Path) -> None:
    """mutmut lists every mutant of the modules it mutates, run or not: a module of
    only_mutate that the listing lacks has none (Protocol declarations only)."""
    path = tmp_path / "results.json"
    mutated = {"pkg.example.schedule", "pkg.example.protocols"}
    assert score_mod.record_results([], path, mutated) == ([], [])  # no listing: nothing known
    assert json.loads(path.read_text(encoding="utf-8")) == {}
    lines = [line for line in RESULTS.splitlines() if ".schedule." in line]
    assert score_mod.record_results(lines, path, mutated) == (["pkg.example.protocols", "pkg.example.schedule"], [])
    assert json.loads(path.read_text(encoding="utf-8"))["pkg.example.protocols"] == {
        "mutants": 0, "killed": 0, "survived": [], "not_run": []}

def _record(tree: Path) -> Path:
    path = tree / "results.json"
    path.write_text(json.dumps({
        "pkg.example.schedule": {"mutants": 1203, "killed": 1199, "survived": [
            "pkg.example.schedule.x_constant_lr__mutmut_1", "pkg.example.schedule.x_noam_lr__mutmut_2"],
            "not_run": ["pkg.example.schedule.x_noam_lr__mutmut_7", "pkg.example.schedule.x_noam_lr__mutmut_8"]},
        "pkg.example.io": {"mutants": 3, "killed": 2, "not_run": [],
                           "survived": ["pkg.example.io.xǁCheckpointManagerǁprune__mutmut_3"]}}))
    return path


def test_the_table_counts_each_recorded_survivor_as_the_list_says(tree: Path) -> None:
    method = _digest(IO, "CheckpointManager.prune")
    listing = _listing(tree, _good_entry(), f"pkg.example.io.xǁCheckpointManagerǁprune__mutmut_3  src={method}  "
                       "device-only  # only a CUDA run could tell")
    done = _run(tree, listing, "--table", "--results", str(_record(tree)))
    assert (done.returncode, done.stderr) == (0, "")
    # Rows by path; the score is killed / (mutants - equivalent), rounded down (1199 / 1202
    # is 99.75%); device-only and not-run mutants stay in the denominator.
    assert done.stdout.splitlines() == [
        "| module | mutants | killed | equivalent | device-only | surviving | not run | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        "| example/io.py | 3 | 2 | 0 | 1 | 0 | 0 | 66.6% |",
        "| example/schedule.py | 1,203 | 1,199 | 1 | 0 | 1 | 2 | 99.7% |",
        "| **total** | **1,206** | **1,201** | **1** | **1** | **1** | **2** | **99.6%** |"]
    # An entry removed from the list makes its survivor count as surviving.
    done = _run(tree, _listing(tree, _good_entry()), "--table", "--results", str(_record(tree)))
    assert "| example/io.py | 3 | 2 | 0 | 0 | 1 | 0 | 66.6% |" in done.stdout.splitlines()


def test_the_table_fails_on_a_mutated_module_without_results_and_the_reverse(tree: Path) -> None:
    record = _record(tree)
    results = json.loads(record.read_text(encoding="utf-8"))
    results["pkg.example.gone"] = results.pop("pkg.example.io")
    record.write_text(json.dumps(results))
    done = _run(tree, _listing(tree, _good_entry()), "--table", "--results", str(record))
    assert done.returncode == 1
    assert "pkg.example.gone: recorded but not in [tool.mutmut] only_mutate" in done.stderr
    assert "pkg.example.io: in [tool.mutmut] only_mutate but no results recorded" in done.stderr


def test_update_docs_replaces_the_table_and_nothing_else(tree: Path) -> None:
    docs = tree / "testing.md"
    docs.write_text("# Testing\n\n**Score** (a machine):\n\n" + "\n".join(score_mod.TABLE_HEAD)
                    + "\n| old/row.py | 1 | 1 | 0 | 0 | 0 | 0 | 100.0% |\n\nThe score is ...\n", encoding="utf-8")
    done = _run(tree, _listing(tree, _good_entry()), "--update-docs", "--docs", str(docs), "--results",
                str(_record(tree)))
    assert done.returncode == 0, done.stderr
    table = score_mod.table_lines(json.loads(_record(tree).read_text(encoding="utf-8")),
                                  score_mod.read_entries(_listing(tree, _good_entry())))
    assert docs.read_text(encoding="utf-8") == ("# Testing\n\n**Score** (a machine):\n\n" + "\n".join(table)
                                                + "\n\nThe score is ...\n")
    again = _run(tree, _listing(tree, _good_entry()), "--update-docs", "--docs", str(docs), "--results",
                 str(_record(tree)))
    assert "score table unchanged" in again.stdout


def test_the_docs_table_is_the_one_derived_from_the_recorded_results() -> None:
    """docs/testing.md's score table is what `mutation_score.py --table` derives from
    tests/mutation_results.json (written by `make mutation`) and the reviewed list, total
    included, with a recorded row for every mutated module: regenerate it with
    `python scripts/mutation_score.py --update-docs`, never by hand."""
    text = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    start, end = score_mod.docs_table(text)
    results = score_mod.read_results()
    assert text.splitlines()[start:end] == score_mod.table_lines(results, score_mod.read_entries())
    assert score_mod.table_problems(results, score_mod.mutated_modules(REPO / "pyproject.toml")) == []
