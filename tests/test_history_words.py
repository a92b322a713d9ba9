"""scripts/check_history_words.py (run by `make lint`): planted history words are reported as
``file:line: word``, real uses of the same words pass, and the product holds none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import check_history_words as checker
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check_history_words.py"


def _words(path: str, text: str) -> list[str]:
    return [str(hit) for hit in checker.scan_text(path, text)]


# A planted file per kind of history word, and exactly what the check prints for it.
PLANTED = {
    "docs/guide.md": (
        "# Guide\n"
        "Measured in the sixteenth session on machine D (2026-11-24).\n"
        "Not run this session; see session 12 and the first and second sessions.\n"
        "The machine-D kind, machines A and B. Fixed in issue 22 (#22), Issues 5.\n"
        "The CPU-performance issue's workload, per the issue (reliability issue).\n"
        "I measured it; I'd keep it. We tried 0.6, we've kept 2.0: our run, ours.\n"
        "This run of work is a lab notebook: scratch notes of a stint.\n"
    ),
    "configs/recipe.yaml": (
        "# Chosen on val (twelfth session: 1.2 beat 0.6)\n"
        "vocab_size: 4000   # 4k for our 3.4k\n"
    ),
    "docs/history.md": (
        "The step added since; the previous full run and the previous run; Previous runs.\n"
        "--buffer-size is its former name; the old `train.tensorboard` and the old row_topk.\n"
        "The earlier recipe timed out once on a loaded machine.\n"
    ),
    "tests/test_data.py": (
        'MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR", REPO.parent / "shared" / "data"))\n'
        "# the mirror is ../shared/data beside the checkout\n"
        'CHECKPOINT = "/work/runs/m30k/member1/averaged"\n'
    ),
    "benchmarks/results/end_to_end.json": '{"source": "/home/alice/data/test.en.gz"}\n',
    "src/pkg/mod.py": (
        '"""We measured this on machine C."""\n'
        "ours = theirs = 1  # I checked it (issue 7)\n"
        "session = I = 2\n"
        'label = ours + " from our run"\n'
    ),
}
GOLDEN = [
    "benchmarks/results/end_to_end.json:1: /home/alice",
    "configs/recipe.yaml:1: session",
    "configs/recipe.yaml:2: our",
    "docs/guide.md:2: session",
    "docs/guide.md:2: machine D",
    "docs/guide.md:2: 2026-11-24",
    "docs/guide.md:3: session",
    "docs/guide.md:3: session 12",
    "docs/guide.md:3: sessions",
    "docs/guide.md:4: machine-D",
    "docs/guide.md:4: machines A",
    "docs/guide.md:4: issue 22",
    "docs/guide.md:4: #22",
    "docs/guide.md:4: Issues 5",
    "docs/guide.md:5: CPU-performance issue",
    "docs/guide.md:5: issue's",
    "docs/guide.md:5: per the issue",
    "docs/guide.md:5: (reliability issue)",
    "docs/guide.md:6: I measured",
    "docs/guide.md:6: I'd",
    "docs/guide.md:6: We",
    "docs/guide.md:6: we've",
    "docs/guide.md:6: our",
    "docs/guide.md:6: ours",
    "docs/guide.md:7: run of work",
    "docs/guide.md:7: lab notebook",
    "docs/guide.md:7: scratch notes",
    "docs/guide.md:7: stint",
    "docs/history.md:1: added since",
    "docs/history.md:1: previous full run",
    "docs/history.md:1: previous run",
    "docs/history.md:1: Previous runs",
    "docs/history.md:2: former name",
    "docs/history.md:2: old `train.tensorboard`",
    "docs/history.md:2: old row_topk",
    "docs/history.md:3: earlier recipe",
    "docs/history.md:3: once on a loaded machine",
    "src/pkg/mod.py:1: We",
    "src/pkg/mod.py:1: machine C",
    "src/pkg/mod.py:2: I checked",
    "src/pkg/mod.py:2: issue 7",
    "src/pkg/mod.py:4: our",
    'tests/test_data.py:1: "shared" / "data"',
    "tests/test_data.py:2: ../shared",
    "tests/test_data.py:3: /work/runs",
]

# Real uses of the same words, in the files where they are allowed: none is reported.
ALLOWED = {
    "tests/serving/conftest.py": (
        '"""Servers built once per test session (one pytest session for all the tests)."""\n'
        '@pytest.fixture(scope="session")\n'
        "@pytest.fixture(scope='session')\n"
        "def ours(session_server):  # names in code are not prose\n"
        "    I = torch.eye(3)\n"
    ),
    "src/aiayn/serving/static/app.js": (
        "const key = sessionStorage.getItem(KEY);  // the tab's storage\n"
        "body { color: #333; }\n"
    ),
    "src/aiayn/serving/app.py": (
        "# An HTTP session ends when the keep-alive session times out.\n"
        "s = requests.Session(); t = tf.Session()\n"
    ),
    "docs/serving.md": "A browser session keeps the key; see [limits](#4-serving) and deploying.md#2.\n",
    "docs/results.md": "| Multi30k | 40.0 | 2026-11-27 |\n",
    "CHANGELOG.md": "## 0.1.0 (2026-11-27)\n",
    "benchmarks/results/decode.json": '{"date": "2026-11-25"}\n',
    "docs/parsing.md": "Table I of the paper; the issue of a request; reissue 5 times; a machine learns.\n",
    # words near the earlier-state ones, and paths outside src/, tests/ and benchmarks/
    "docs/training.md": ("Resuming continues the run; old checkpoints are removed; a run since the last save.\n"
                         "A mirror folder such as /home/me/mirror or ../shared/data.\n"),
    "tests/test_readme.py": 'assert "../shared" not in README.read_text(encoding="utf-8")\n',
}


def _plant(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")


def test_planted_history_words_are_reported_with_file_and_line(tmp_path: Path) -> None:
    _plant(tmp_path, {**PLANTED, **ALLOWED})
    proc = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == GOLDEN
    assert proc.stderr.startswith(f"{len(GOLDEN)} development-history word(s)")


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_real_uses_of_the_same_words_pass(name: str) -> None:
    assert _words(name, ALLOWED[name]) == []


def test_allowed_uses_are_allowed_only_in_their_files() -> None:
    assert _words("docs/training.md", "Built once per test session (2026-11-27).\n") == [
        "docs/training.md:1: session", "docs/training.md:1: 2026-11-27"]
    assert _words("tests/x.py", '@pytest.fixture(scope="session")  # as in the sixth session\n') == [
        "tests/x.py:1: session"]


def test_a_clean_tree_passes_and_binary_files_are_skipped(tmp_path: Path) -> None:
    _plant(tmp_path, ALLOWED)
    (tmp_path / "docs" / "plot.png").write_bytes(b"\x89PNG\0machine D session")
    (tmp_path / "src" / "latin1.txt").write_bytes("session \xe9".encode("latin-1"))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path)],
                          capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_given_paths_limit_the_check(tmp_path: Path) -> None:
    _plant(tmp_path, PLANTED)
    assert [str(h) for h in checker.scan(tmp_path, ["configs"])] == [g for g in GOLDEN if g.startswith("configs/")]


def test_the_checker_and_this_test_are_exempt() -> None:
    assert checker.scan(REPO, ["scripts/check_history_words.py", "tests/test_history_words.py"]) == []


def test_the_repository_speaks_of_the_product_only() -> None:
    """What `make lint` checks: no history word in the product's files."""
    assert [str(hit) for hit in checker.scan(REPO)] == []
