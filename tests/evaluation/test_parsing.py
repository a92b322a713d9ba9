"""EVALB bracket scores (aiayn.evaluation.evalb) of hand-made trees and corpora.

Expected values are counted by hand; the comment above each case lists the brackets
EVALB scores, as (label start end) over the words left after deleting punctuation. Each
rule of the scorer (module docstring: quote fix, deletion, unlabeled matching, crossing,
skipped and error sentences) is pinned to the exact figures and message it produces; the
EVALB reference outputs are compared in test_evalb_reference.py, parameter files in
test_evalb_params.py, files and the printed report in test_evalb_report.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from pathlib import Path

import pytest

from aiayn.data.trees import Tree, clean_tree, linearize, parse_tree, read_trees, rebuild, tree_to_string
from aiayn.errors import DataError
from aiayn.evaluation.evalb import (
    ERROR,
    OK,
    SKIP,
    EvalbParams,
    evalb,
    evalb_files,
    evalb_label,
    evalb_summary,
    score_sentence,
)

# The offline data mirror (real corpora): $AIAYN_DATA_MIRROR alone, which .ci/run sets. Unset, a
# path that exists nowhere and names the variable, so the tests that need data skip saying so.
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR") or "/AIAYN_DATA_MIRROR-is-not-set")
PTB_FILES = MIRROR / "ptb-sample" / "combined"
LOGGER = "aiayn.evaluation.evalb"

# Words: The cat sat on the mat .  -> scored positions 0..5 (the period is deleted).
# Brackets: S 0 6, NP 0 2, VP 2 6, PP 3 6, NP 4 6  (5)
GOLD = "(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))"


def scores(gold: str, test: str) -> tuple[int, int, int]:
    s = score_sentence(parse_tree(gold), parse_tree(test))
    return s.matched, s.gold_brackets, s.test_brackets


def sentence_figures(gold: str | Tree, test: str | Tree, params: EvalbParams | None = None) -> tuple:
    """(status, matched, gold brackets, test brackets, crossing, words, correct tags, error)."""
    s = score_sentence(
        gold if isinstance(gold, Tree) else parse_tree(gold),
        test if isinstance(test, Tree) else parse_tree(test),
        params=params,
    )
    return s.status, s.matched, s.gold_brackets, s.test_brackets, s.crossing, s.words, s.correct_tags, s.error


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


# ---------------------------------------------------------- sentence rules, exact figures

QUOTES = EvalbParams(delete_labels=frozenset({"``"}), quote_labels=frozenset({"CD", "``"}))


@pytest.mark.parametrize(
    ("gold", "test", "eq_labels", "expected"),
    [
        # the test tree deletes its quote, the gold keeps it (CD): put back into the test tree
        ('(S (NP (CD ") (NN x)) (VP (VB y)))', '(S (NP (`` ") (NN x)) (VP (VB y)))', (), (3, 3, 3, 3, 2)),
        # ... and its tag, compared with the gold one (equal under EQ_LABEL)
        ('(S (NP (CD ") (NN x)) (VP (VB y)))', '(S (NP (`` ") (NN x)) (VP (VB y)))', (("``", "CD"),),
         (3, 3, 3, 3, 3)),
        # two quotes put back: the second one's position moves by one after the first
        ('(S (NP (CD ") (NN x)) (VP (VB y) (CD ") (NN z)))', '(S (NP (`` ") (NN x)) (VP (VB y) (`` ") (NN z)))',
         (), (5, 3, 3, 3, 3)),
        ('(S (NP (CD ") (NN x)) (VP (VB y) (CD ") (NN z)))', '(S (NP (`` ") (NN x)) (VP (VB y) (`` ") (NN z)))',
         (("CD", "``"),), (5, 3, 3, 3, 5)),
        # a gold quote put back, its tag compared through EQ_LABEL
        ('(S (NP (`` ") (NN x)) (VP (VB y)))', '(S (NP (CD ") (NN x)) (VP (VB y)))', (("``", "CD"),),
         (3, 3, 3, 3, 3)),
    ],
)
def test_quote_fix_puts_back_in_either_tree(gold: str, test: str, eq_labels: tuple, expected: tuple) -> None:
    params = dataclasses.replace(QUOTES, eq_labels=eq_labels)
    status, matched, gold_n, test_n, _, words, tags, _ = sentence_figures(gold, test, params)
    assert status == OK
    assert (words, matched, gold_n, test_n, tags) == expected


def test_quote_fix_updates_positions_as_evalb() -> None:
    # The first pair's put-back shifts the test tree's later quote past its gold partner:
    # EVALB then pairs nothing more, and the counts stay unequal.
    gold = '(S (NP (CD ") (NN x)) (VP (VB y) (`` ") (NN z)))'
    test = '(S (NP (`` ") (NN x)) (VP (VB y) (CD ") (NN z)))'
    assert sentence_figures(gold, test, QUOTES) == (ERROR, 0, 0, 0, 0, 4, 0,
                                                    "words differ at word 1: gold '\"', test 'x'")


@pytest.mark.parametrize(
    ("gold", "test", "params", "expected"),
    [
        # EVALB: the test tree loses its own punctuation
        ("(S (NN a) (. .))", "(S (. .))", EvalbParams(delete_labels=frozenset({"."})),
         (SKIP, 0, 0, 0, 0, 1, 0, "no word left in the test tree")),
        # gold tags: both trees lose the gold tree's punctuation
        ("(S (. .))", "(S (XX .))", None, (SKIP, 0, 0, 0, 0, 0, 0, "no word left after deletion")),
        # a word spelled "" (a Tree built in code) is compared as ""
        (Tree("S", [Tree("NN", [], "")]), "(S (NN x))", EvalbParams(),
         (ERROR, 0, 0, 0, 0, 1, 0, "words differ at word 1: gold '', test 'x'")),
        # unlabeled matching still takes each test bracket once: NP 0 2 twice in gold, once in test
        ("(S (NP (NP (DT the) (NN cat))) (VP (VBD sat)))", "(S (NP (DT the) (NN cat)) (VP (VBD sat)))",
         EvalbParams(labeled=False), (OK, 3, 4, 3, 0, 3, 3, "")),
        # no bracket left at all (TOP deleted): nothing to cross
        ("(TOP (NN x))", "(TOP (XX x))", None, (OK, 0, 0, 0, 0, 1, 0, "")),
        # gold tags: -NONE- elements leave the test tree too before the words are aligned
        ("(S (NP (NN x)) (VP (VB y)))", "(S (XX x) (VP (-NONE- *) (XX y)))", None, (OK, 2, 3, 2, 0, 2, 0, "")),
        # three test brackets each crossing a gold one
        ("(S (A (P a) (Q b)) (B (P c) (Q d)) (C (P e) (Q f)) (D (P g) (Q h)))",
         "(S (P a) (X (Q b) (P c)) (Y (Q d) (P e)) (Z (Q f) (P g)) (Q h))", EvalbParams(),
         (OK, 1, 5, 4, 3, 8, 8, "")),
    ],
)
def test_sentence_figures(gold: str | Tree, test: str, params: EvalbParams | None, expected: tuple) -> None:
    assert sentence_figures(gold, test, params) == expected


def test_summary_counts_sentences_by_crossing() -> None:
    gold = "(S (A (P a) (Q b)) (B (P c) (Q d)) (C (P e) (Q f)) (D (P g) (Q h)))"
    three = "(S (P a) (X (Q b) (P c)) (Y (Q d) (P e)) (Z (Q f) (P g)) (Q h))"  # crossing 3
    two = "(S (P a) (X (Q b) (P c)) (Y (Q d) (P e)) (Q f) (P g) (Q h))"  # crossing 2
    scores = [score_sentence(parse_tree(gold), parse_tree(t), params=EvalbParams()) for t in (three, two, gold)]
    assert [s.crossing for s in scores] == [3, 2, 0]
    summary = evalb_summary(scores)
    assert (summary.crossing, summary.no_crossing_sentences, summary.two_or_less_crossing_sentences) == (5, 1, 2)
    assert summary.two_or_less_crossing == pytest.approx(200 / 3)


def test_corpus_of_skipped_sentences_only() -> None:
    result = evalb(["(S (. .))"], ["(S (XX .))"])
    assert result == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "exact_match": 0.0, "sentences": 0,
                      "skipped": 1, "matched": 0, "gold_brackets": 0, "test_brackets": 0}
    summary = evalb_summary([score_sentence(parse_tree("(S (. .))"), parse_tree("(S (XX .))"))])
    assert (summary.complete_match, summary.no_crossing, summary.two_or_less_crossing) == (0.0, 0.0, 0.0)


def test_error_sentences_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        evalb(["(S (NN a))", "(S (NN b))"], ["(S (NN a))", "(S (NN c))"], params=EvalbParams())
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "sentence 2: words differ at word 1: gold 'b', test 'c'"
    ]


# ------------------------------------------------------------------------------ corpus


@pytest.mark.parametrize(
    ("gold", "pred", "message"),
    [
        (["(S (NN a))", "(S (NN b)"], ["(S (NN a))", "(S (NN b))"],
         "gold sentence 2:1: unbalanced brackets (tree never closed)"),
        (["(S (NN a))", "(S (NN b))"], ["(S (NN a))", "(S (NN b)"],
         "predicted sentence 2:1: unbalanced brackets (tree never closed)"),
    ],
)
def test_evalb_names_the_unreadable_string(gold: list[str], pred: list[str], message: str) -> None:
    with pytest.raises(DataError) as e:
        evalb(gold, pred)
    assert str(e.value) == message


def test_evalb_takes_tree_objects() -> None:
    result = evalb([parse_tree("(S (NP (NN a)) (VP (VB b)))")], [parse_tree("(S (NN a) (VP (VB b)))")])
    assert result == {"precision": 100.0, "recall": pytest.approx(200 / 3), "f1": pytest.approx(80.0),
                      "exact_match": 0.0, "sentences": 1, "skipped": 0, "matched": 2, "gold_brackets": 3,
                      "test_brackets": 2}
