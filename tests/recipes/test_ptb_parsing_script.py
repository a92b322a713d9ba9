"""scripts/ptb_parsing.sh trains one model (or MEMBERS side by side), averages and parses valid
and test (with the members' ensemble) at the length penalty LENPEN, seen through an `aiayn`
that records its calls; the end-to-end run itself is test_ptb_parsing_slow.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT, recorded_calls, recording_aiayn

# What the real commands leave for the script's summary lines: a train log and summary per
# run directory, and the scores `aiayn parse --json` prints.
WRITES_RESULTS = r"""
if [ "$1" = train ]; then
  while [ $# -gt 0 ]; do [ "$1" = --run-dir ] && run="$2"; shift; done
  mkdir -p "$run"
  echo "training 9 parameters on cpu" > "$run/train.log"
  echo '{"step": 9, "epoch": 0.5, "elapsed": 60, "stop_reason": "max_steps"}' > "$run/train_summary.json"
elif [ "$1" = parse ]; then
  while [ $# -gt 0 ]; do [ "$1" = --split ] && split="$2"; shift; done
  echo "{\"split\": \"$split\", \"f1\": 80.5, \"precision\": 81, \"recall\": 80, \"exact_match\": 20,
    \"repaired\": 0, \"parsed\": 9, \"seconds\": 3}"
fi
"""


def _script(tmp_path: Path, *overrides: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PTB_DIR": "/treebank", "PREPARED": str(tmp_path / "data-bin"),
                "RUN": str(tmp_path / "run"), **recording_aiayn(tmp_path, WRITES_RESULTS), **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "ptb_parsing.sh"), *overrides],
                          cwd=ROOT, env=full_env, capture_output=True, text=True)


def test_two_members_train_side_by_side_and_parse_as_one(tmp_path: Path) -> None:
    proc = _script(tmp_path, "train.max_steps=9", AIAYN_NUM_THREADS="2", MEMBERS="2", LENPEN="2.0")
    assert proc.returncode == 0, proc.stderr
    run, prep, config = tmp_path / "run", tmp_path / "data-bin", "configs/ptb_parsing.yaml"
    assert sorted(recorded_calls(tmp_path, "train")) == [
        f"threads=1 train --config {config} --run-dir {run}/member{k} data.prepared_dir={prep} train.max_steps=9 "
        f"train.seed={k}" for k in (1, 2)]
    assert recorded_calls(tmp_path, "average") == [
        f"threads=2 average {run}/member{k} --last 5 --out {run}/member{k}/averaged --force" for k in (1, 2)]
    assert recorded_calls(tmp_path, "parse") == [
        f"threads=2 parse --checkpoint {run}/member1/averaged {run}/member2/averaged --ensemble --prepared {prep} "
        f"--split {split} --lenpen 2.0 --output {run}/{split}.trees.txt --json --quiet" for split in ("valid", "test")]
    assert "valid: F1 80.50 (P 81.00, R 80.00), exact match 20.00, 0 of 9 predictions repaired, 3 s" in proc.stdout
    assert proc.stdout.count("trained 9 steps, 0.5 epochs in 1.0 min (max_steps)") == 2


@pytest.mark.parametrize("seed", [None, "7"])
def test_by_default_one_model_on_every_thread_at_the_papers_length_penalty(tmp_path: Path, seed: str | None) -> None:
    proc = _script(tmp_path, AVERAGE="3", **({"SEED": seed} if seed else {}))
    assert proc.returncode == 0, proc.stderr
    run, prep = tmp_path / "run", tmp_path / "data-bin"
    assert recorded_calls(tmp_path, "train") == [
        f"threads=4 train --config configs/ptb_parsing.yaml --run-dir {run} data.prepared_dir={prep}"
        + (f" train.seed={seed}" if seed else "")]
    assert recorded_calls(tmp_path, "average") == [f"threads=4 average {run} --last 3 --out {run}/averaged --force"]
    assert recorded_calls(tmp_path, "parse")[0] == (
        f"threads=4 parse --checkpoint {run}/averaged --prepared {prep} --split valid --lenpen 0.3 "
        f"--output {run}/valid.trees.txt --json --quiet")


@pytest.mark.parametrize(("name", "value", "message"), [
    ("MEMBERS", "0", "give a whole number of models, 1 or more"),
    ("SEED", "x", "give a whole number, the first member's seed"),
    ("LENPEN", "-1", "give a number >= 0, the length penalty's alpha"),
    ("LENPEN", "high", "give a number >= 0, the length penalty's alpha"),
])
def test_bad_members_or_seed_is_one_line_before_anything_runs(tmp_path: Path, name: str, value: str,
                                                               message: str) -> None:
    proc = _script(tmp_path, **{name: value})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"ptb_parsing.sh: {name}={value}: {message}"]
    assert not (tmp_path / "calls.txt").exists()
