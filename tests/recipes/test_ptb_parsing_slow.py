"""The parsing recipe end to end, reduced to fit `make test-slow`: `scripts/ptb_parsing.sh`
(prepare the PTB sample from the offline mirror, train the shipped recipe for a fixed number
of updates, average the last checkpoints, parse dev and test with beam 21, constrained, and
score with EVALB), the documented command.

The floor sits well above the baselines (docs/benchmarks.md, "Constituency parsing"): one
flat ``S`` over the words scores 9.55 test F1, the labelled right-branching tree 12.58. The
recipe's own run, averaged over its checkpoints up to step 1,000, scored 36.0 dev F1 greedy;
this test's first run (2026-11-24, machine D, 228 s of training, the recipe without the
phrases) scored 45.56 dev and 43.97 test F1 with beam 21, constrained; with the phrases
(``data.parsing_subtrees: 3``) it passed again in 295 s; with the same-tag variants
(``data.parsing_substitutions: 3``, 2026-11-25, machine D, bf16) it scored 38.31 dev and 37.62
test F1 after 209 s of training (1,000 steps are 0.4 of an epoch of that data), passing in
311 s. A regression in any stage (tree cleaning,
linearization, tokenizer, training, averaging, the search, the tree constraint, the rebuild,
EVALB) drops it below the floor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aiayn.data.trees import parse_tree, read_trees

STEPS = 1000
F1_FLOOR = 30.0


@pytest.mark.slow
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
