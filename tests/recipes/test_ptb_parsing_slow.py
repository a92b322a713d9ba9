"""The parsing recipe end to end, reduced to fit `make test-slow`: `scripts/ptb_parsing.sh`
(prepare the PTB sample from the offline mirror, train the shipped recipe for a fixed number
of updates, average the last checkpoints, parse dev and test with beam 21, constrained, and
score with EVALB), the documented command.

The floor sits well above the baselines (docs/benchmarks.md, "Constituency parsing": one
flat ``S`` over the words scores 9.55 test F1, the labelled right-branching tree 12.58) and
just under the measured figures of this test's configuration (1,000 updates, the last 3
checkpoints averaged, beam 21, constrained): F1 from 37.4 to 45.6 on dev and test over the
measured runs and recipe variants (with and without the phrase and same-tag training
extras, the paper's schedule), 40.06 dev and 39.09 test with the recipe's warmup-stable-decay
schedule over the 1,000 steps. A regression in any stage (tree cleaning, linearization,
tokenizer, training, averaging, the search, the tree constraint, the rebuild, EVALB) drops it
below the floor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiayn.data.trees import parse_tree, read_trees

STEPS = 1000
F1_FLOOR = 35.0  # measured: 37.4 to 45.6, and 39.09 with the recipe (within 5 of the lowest)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 340 s on 2 cores (460 s on AVX2 only); up to twice that beside other work
def test_ptb_parsing_reduced_run_parses(run_recipe, tmp_path: Path) -> None:
    proc = run_recipe("ptb_parsing.sh", "ptb-sample", f"train.max_steps={STEPS}", "train.keep_last=3")
    for split in ("valid", "test"):
        scores = json.loads((tmp_path / "run" / f"{split}.scores.json").read_text())
        assert scores["repaired"] == 0, scores
        assert scores["f1"] >= F1_FLOOR, scores
        assert f"{split}: F1 {scores['f1']:.2f}" in proc.stdout  # the script prints what it scored
    # One tree per test sentence, over exactly its words.
    gold = [t.leaves() for t in read_trees(tmp_path / "data-bin" / "test.gold.txt")]
    predicted = (tmp_path / "run" / "test.trees.txt").read_text(encoding="utf-8").splitlines()
    assert [parse_tree(line).leaves() for line in predicted] == gold
