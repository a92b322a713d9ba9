"""scripts/mutation_score.py: the score per module from `mutmut results --all true`."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutation_score.py"
spec = importlib.util.spec_from_file_location("mutation_score", SCRIPT)
assert spec and spec.loader
score_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(score_mod)

RESULTS = """\
    pkg.example.schedule.x_noam_lr__mutmut_1: killed
    pkg.example.schedule.x_noam_lr__mutmut_2: survived
    pkg.example.schedule.x_constant_lr__mutmut_1: survived
    pkg.example.schedule.x_constant_lr__mutmut_2: timeout
    pkg.example.io.xǁCheckpointManagerǁprune__mutmut_3: no tests
    pkg.example.io.xǁCheckpointManagerǁprune__mutmut_4: killed
    pkg.example.io.x_save_optimizer__mutmut_9: not checked
"""


def test_modules_statuses_and_equivalents_are_tallied() -> None:
    per_module, survivors = score_mod.tally(RESULTS.splitlines(),
                                            {"pkg.example.schedule.x_constant_lr__mutmut_1"})
    assert per_module == {
        "pkg.example.schedule": Counter(killed=2, survived=1, equivalent=1),
        "pkg.example.io": Counter(killed=1, survived=1, other=1),
    }
    assert survivors == ["pkg.example.schedule.x_noam_lr__mutmut_2: survived",
                         "pkg.example.io.xǁCheckpointManagerǁprune__mutmut_3: no tests",
                         "pkg.example.io.x_save_optimizer__mutmut_9: not checked"]
    # Equivalent mutants leave the denominator; timeouts count as killed.
    assert score_mod.score(per_module["pkg.example.schedule"]) == 100 * 2 / 3
    assert score_mod.score(per_module["pkg.example.io"]) == 100 * 1 / 3


def test_the_review_file_lists_names_with_reasons(tmp_path: Path) -> None:
    review = tmp_path / "equivalent.txt"
    review.write_text("# header\n\na.b.x_f__mutmut_1  # the default is never used\na.b.x_g__mutmut_2\n")
    assert score_mod.equivalent_mutants(review) == {"a.b.x_f__mutmut_1", "a.b.x_g__mutmut_2"}
    assert score_mod.equivalent_mutants(tmp_path / "absent.txt") == set()


def test_the_exit_code_follows_the_target() -> None:
    def run(target: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), "--target", target], input=RESULTS,
                              capture_output=True, text=True)
    low, high = run("40"), run("50")
    # 3 killed of 7 judged (the repo's review file names no mutant of this made-up package).
    assert (low.returncode, high.returncode) == (0, 1)
    assert "total" in low.stdout and "42.9%" in low.stdout
