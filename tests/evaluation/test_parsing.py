"""Tests for aiayn.evaluation.parsing: EVALB (COLLINS.prm) bracket scores.

Expected values are counted by hand; the comment above each case lists the brackets
EVALB scores, as (label start end) over the words left after deleting punctuation.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from aiayn.data.trees import clean_tree, linearize, parse_tree, read_trees, rebuild, tree_to_string
from aiayn.errors import DataError
from aiayn.evaluation.parsing import evalb, evalb_files, evalb_label, score_sentence

MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR", Path(__file__).resolve().parents[3] / "shared" / "data"))
PTB_FILES = MIRROR / "ptb-sample" / "combined"

# Words: The cat sat on the mat .  -> scored positions 0..5 (the period is deleted).
# Brackets: S 0 6, NP 0 2, VP 2 6, PP 3 6, NP 4 6  (5)
GOLD = "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))"


def scores(gold: str, test: str) -> tuple[int, int, int]:
    s = score_sentence(parse_tree(gold), parse_tree(test))
    return s.matched, s.gold_brackets, s.test_brackets


def test_tree_against_itself_is_100() -> None:
    result = evalb([GOLD], [GOLD])
    assert result["precision"] == result["recall"] == result["f1"] == result["exact_match"] == 100.0
    assert (result["matched"], result["gold_brackets"], result["test_brackets"]) == (5, 5, 5)
    assert result["sentences"] == 1 and result["skipped"] == 0


@pytest.mark.parametrize(
    ("test", "counts", "metrics"),
    [
        # PP attached low only over "on": S 0 6, NP 0 2, VP 2 6, PP 3 4, NP 4 6 -> 4 of 5 match
        (
            "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on)) (NP (DT the) (NN mat))) (. .))",
            (4, 5, 5),
            (80.0, 80.0, 80.0),
        ),
        # flat: only S 0 6 -> P 1/1, R 1/5, F1 = 2*100*20/120
        (
            "(S (DT The) (NN cat) (VBD sat) (IN on) (DT the) (NN mat) (. .))",
            (1, 5, 1),
            (100.0, 20.0, 100.0 / 3),
        ),
        # the period inside VP: spans are the same once punctuation is gone
        (
            "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat))) (. .)))",
            (5, 5, 5),
            (100.0, 100.0, 100.0),
        ),
        # wrong label SBAR for PP 3 6; an extra ADJP 5 6: 4 matched of 5 gold, 6 test
        (
            "(S (NP (DT The) (NN cat)) (VP (VBD sat) (SBAR (IN on) (NP (DT the) (ADJP (NN mat))))) (. .))",
            (4, 5, 6),
            (400 / 6, 80.0, 2 * (400 / 6) * 80 / (400 / 6 + 80)),
        ),
        # TOP is not a bracket; function tags are cut from test labels too
        (
            "(TOP (S (NP-SBJ (DT The) (NN cat)) (VP (VBD sat) (PP-LOC (IN on) (NP=1 (DT the) (NN mat)))) (. .)))",
            (5, 5, 5),
            (100.0, 100.0, 100.0),
        ),
        # predicted trees carry XX tags: punctuation is found with the gold tags
        (
            "(S (NP (XX The) (XX cat)) (VP (XX sat) (PP (XX on) (NP (XX the) (XX mat) (XX .)))))",
            (5, 5, 5),
            (100.0, 100.0, 100.0),
        ),
    ],
)
def test_hand_made_variants(test: str, counts: tuple[int, int, int], metrics: tuple[float, float, float]) -> None:
    precision, recall, f1 = metrics
    assert scores(GOLD, test) == counts
    result = evalb([GOLD], [test])
    assert result["precision"] == pytest.approx(precision)
    assert result["recall"] == pytest.approx(recall)
    assert result["f1"] == pytest.approx(f1)
    assert result["exact_match"] == (100.0 if counts[0] == counts[1] == counts[2] else 0.0)


def test_prt_and_advp_are_one_label() -> None:
    gold = "(S (NP (PRP He)) (VP (VBD gave) (PRT (RP up))))"  # S 0 3, NP 0 1, VP 1 3, PRT 2 3
    assert scores(gold, "(S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up))))") == (4, 4, 4)
    assert scores(gold, "(S (NP (PRP He)) (VP (VBD gave) (NP (RP up))))") == (3, 4, 4)
    assert evalb_label("PRT") == evalb_label("ADVP") == "ADVP"
    assert evalb_label("NP-SBJ-1") == evalb_label("NP=2") == "NP"


def test_duplicate_brackets_count_as_a_multiset() -> None:
    double = "(S (NP (NP (DT the) (NN cat))) (VP (VBD sat)))"  # S 0 3, NP 0 2, NP 0 2, VP 2 3
    single = "(S (NP (DT the) (NN cat)) (VP (VBD sat)))"  # S 0 3, NP 0 2, VP 2 3
    result = evalb([double], [single])
    assert (result["matched"], result["gold_brackets"], result["test_brackets"]) == (3, 4, 3)
    assert result["precision"] == 100.0 and result["recall"] == 75.0
    assert result["f1"] == pytest.approx(2 * 75 / 1.75)
    reverse = evalb([single], [double])
    assert reverse["precision"] == 75.0 and reverse["recall"] == 100.0
    assert evalb([double], [double])["f1"] == 100.0


def test_raw_treebank_gold_scores_like_cleaned() -> None:
    # The trace S and its NP-SBJ span no word: deleted. The outer "( ... )" is not a bracket.
    raw = "( (S (NP-SBJ-1 (DT The) (NN cat)) (VP (VBD sat) (S (NP-SBJ (-NONE- *-1)))) (. .)))"
    clean = "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"  # S 0 3, NP 0 2, VP 2 3
    assert scores(raw, clean) == (3, 3, 3)
    assert tree_to_string(clean_tree(parse_tree(raw))) == clean


def test_bracket_over_punctuation_only_is_not_counted() -> None:
    gold = "(S (NP (DT The) (NN cat)) (PRN (: --)) (VP (VBD sat)) (. .))"  # S 0 3, NP 0 2, VP 2 3
    assert scores(gold, "(S (NP (DT The) (NN cat)) (: --) (VP (VBD sat)) (. .))") == (3, 3, 3)


def test_punctuation_only_sentence_is_skipped() -> None:
    result = evalb(["(FRAG (: --) (. .))", GOLD], ["(FRAG (: --) (. .))", GOLD])
    assert result["skipped"] == 1 and result["sentences"] == 1 and result["f1"] == 100.0


def test_corpus_totals_are_summed_before_dividing() -> None:
    low = "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on)) (NP (DT the) (NN mat))) (. .))"
    flat = "(S (DT The) (NN cat) (VBD sat) (IN on) (DT the) (NN mat) (. .))"
    # matched 4 + 1, gold 5 + 5, test 5 + 1
    result = evalb([GOLD, GOLD], [low, flat])
    assert (result["matched"], result["gold_brackets"], result["test_brackets"]) == (5, 10, 6)
    assert result["precision"] == pytest.approx(500 / 6)
    assert result["recall"] == 50.0
    assert result["f1"] == pytest.approx(2 * (500 / 6) * 50 / (500 / 6 + 50))
    assert result["exact_match"] == 0.0
    assert evalb([GOLD, GOLD], [GOLD, low])["exact_match"] == 50.0


def test_max_length_keeps_short_sentences() -> None:
    short = "(S (NP (PRP He)) (VP (VBD sat)) (. .))"  # length 3: punctuation counts here
    flat = "(S (PRP He) (VBD sat) (. .))"
    result = evalb([GOLD, short], [GOLD, flat], max_length=3)
    assert result["sentences"] == 1
    assert (result["matched"], result["gold_brackets"], result["test_brackets"]) == (1, 3, 1)
    assert evalb([GOLD, short], [GOLD, flat], max_length=7)["sentences"] == 2


def test_mismatches_raise_data_error() -> None:
    with pytest.raises(DataError, match="sentence 1: length mismatch"):
        evalb([GOLD], ["(S (NN The))"])
    with pytest.raises(DataError, match="sentence 2: words differ at word 2"):
        evalb([GOLD, GOLD], [GOLD, GOLD.replace("cat", "dog")])
    with pytest.raises(DataError, match="1 gold trees but 2"):
        evalb([GOLD], [GOLD, GOLD])


def test_evalb_files_mrg_gold_and_line_predictions(tmp_path: Path) -> None:
    gold = tmp_path / "gold.mrg"
    gold.write_text(
        "( (S (NP-SBJ (DT The) (NN cat))\n    (VP (VBD sat)) (. .)))\n"
        "( (S (NP-SBJ (PRP He))\n    (VP (VBD gave) (PRT (RP up)))))\n",
        encoding="utf-8",
    )
    pred = tmp_path / "pred.txt"
    pred.write_text(
        "(S (NP (XX The) (XX cat)) (VP (XX sat) (XX .)))\n(S (XX He) (VP (XX gave) (ADVP (XX up))))\n",
        encoding="utf-8",
    )
    # matched 3 + 3, gold 3 + 4, test 3 + 3
    result = evalb_files(gold, pred)
    assert (result["matched"], result["gold_brackets"], result["test_brackets"]) == (6, 7, 6)
    assert result["exact_match"] == 50.0

    pred.write_text("(S (NP (XX The) (XX cat)) (VP (XX sat) (XX .)))\n(S (XX He) (VP (XX gave)))\n")
    with pytest.raises(DataError, match=r"gold\.mrg:3 vs .*pred\.txt:2: length mismatch"):
        evalb_files(gold, pred)
    pred.write_text("(S (NP (XX The) (XX cat)) (VP (XX sat) (XX .)))\n")
    with pytest.raises(DataError, match="has 2 trees but"):
        evalb_files(gold, pred)


@pytest.mark.skipif(not PTB_FILES.is_dir(), reason=f"the data mirror has no {PTB_FILES}")
def test_dev_files_placeholder_tags_score_like_gold_tags() -> None:
    gold = []
    for i in range(160, 180):
        gold.extend(t for t in map(clean_tree, read_trees(PTB_FILES / f"wsj_{i:04d}.mrg")) if t is not None)
    assert evalb(gold, gold)["f1"] == 100.0
    # Damaged predictions: scoring a rebuilt tree with XX tags equals scoring it with the
    # gold tags put back, i.e. what EVALB itself reports for such a tree.
    rng = random.Random(7)
    with_xx, with_tags = [], []
    for tree in gold:
        tokens = linearize(tree)
        for _ in range(3):
            i = rng.randrange(len(tokens))
            tokens[i] = rng.choice(["(NP", ")NP", "XX", "(PRT", "(TOP"])
        with_xx.append(rebuild(tokens, tree.leaves()))
        with_tags.append(rebuild(tokens, tree.leaves(), tree.tags()))
    damaged = evalb(gold, with_xx)
    assert damaged == evalb(gold, with_tags)
    assert 0.0 < damaged["f1"] < 100.0
