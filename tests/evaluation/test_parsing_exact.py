"""Exact figures, messages and printouts of aiayn.evaluation.parsing on small hand-made cases.

Each case pins one rule of the scorer (module docstring) to the number, message or text it
produces, so that a change to that rule shows; the EVALB reference outputs are compared in
test_evalb_reference.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import aiayn
from aiayn.data.trees import Tree, parse_tree
from aiayn.errors import DataError
from aiayn.evaluation.parsing import (
    ERROR,
    OK,
    SKIP,
    EvalbParams,
    evalb,
    evalb_files,
    evalb_report,
    evalb_sentences,
    evalb_summary,
    score_sentence,
)

LOGGER = "aiayn.evaluation.parsing"


def score(gold: str | Tree, test: str | Tree, params: EvalbParams | None = None) -> tuple:
    """(status, matched, gold brackets, test brackets, crossing, words, correct tags, error)."""
    s = score_sentence(
        gold if isinstance(gold, Tree) else parse_tree(gold),
        test if isinstance(test, Tree) else parse_tree(test),
        params=params,
    )
    return s.status, s.matched, s.gold_brackets, s.test_brackets, s.crossing, s.words, s.correct_tags, s.error


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ parameters
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "DEBUG 0\nQUOTE_LABELS x\n",
            ":2: unknown EVALB parameter 'QUOTE_LABELS' (known: DEBUG, MAX_ERROR, CUTOFF_LEN, LABELED, "
            "DELETE_LABEL, DELETE_LABEL_FOR_LENGTH, QUOTE_LABEL, EQ_LABEL, EQ_WORD)",
        ),
        ("# c\nEQ_LABEL A\n", ":2: EQ_LABEL takes 2 value(s), got 1: 'A'"),
        ("EQ_WORD a b c\n", ":1: EQ_WORD takes 2 value(s), got 3: 'a b c'"),
        ("CUTOFF_LEN forty\n", ":1: CUTOFF_LEN needs an integer, got 'forty'"),
    ],
)
def test_prm_error_messages_exactly(tmp_path: Path, text: str, message: str) -> None:
    prm = write(tmp_path / "p.prm", text)
    with pytest.raises(DataError) as e:
        EvalbParams.read(prm)
    assert str(e.value) == f"{prm}{message}"


def test_prm_missing_file_message(tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        EvalbParams.read(tmp_path / "nope.prm")
    assert str(e.value) == f"{tmp_path / 'nope.prm'}: cannot read parameter file (No such file or directory)"


def test_prm_reading_does_not_depend_on_the_locale(tmp_path: Path) -> None:
    # Under an ASCII locale (no UTF-8 mode, no locale coercion) a UTF-8 parameter file still reads.
    prm = write(tmp_path / "p.prm", "DELETE_LABEL «\nEQ_WORD é e\n")
    code = "import sys; from aiayn.evaluation.parsing import EvalbParams; print(ascii(EvalbParams.read(sys.argv[1])))"
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONPATH": str(Path(aiayn.__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code, str(prm)], env=env, capture_output=True, text=True,
                          check=False)
    expected = EvalbParams(delete_labels=frozenset({"«"}), eq_words=(("é", "e"),))
    assert EvalbParams.read(prm) == expected  # in this process, whatever its locale
    assert (done.returncode, done.stdout) == (0, ascii(expected) + "\n"), done.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # keys left out take EVALB's built-in values
        ("DELETE_LABEL X\n", EvalbParams(delete_labels=frozenset({"X"}))),
        ("", EvalbParams()),
        # a number key given twice: the last line wins
        (
            "MAX_ERROR 1\nMAX_ERROR 3\nCUTOFF_LEN 30\nDEBUG 1\nLABELED 5\n",
            EvalbParams(max_error=3, cutoff_len=30, debug=1, labeled=True),
        ),
        ("LABELED -1\nCUTOFF_LEN +7\n", EvalbParams(labeled=True, cutoff_len=7)),
        ("QUOTE_LABEL ``\nQUOTE_LABEL CD\nEQ_LABEL A B\n", EvalbParams(quote_labels=frozenset({"``", "CD"}),
                                                                        eq_labels=(("A", "B"),))),
    ],
)
def test_prm_values_and_defaults(tmp_path: Path, text: str, expected: EvalbParams) -> None:
    assert EvalbParams.read(write(tmp_path / "p.prm", text)) == expected


# ------------------------------------------------------------------------------ sentences
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
    status, matched, gold_n, test_n, _, words, tags, _ = score(gold, test, params)
    assert status == OK
    assert (words, matched, gold_n, test_n, tags) == expected


def test_quote_fix_updates_positions_as_evalb() -> None:
    # The first pair's put-back shifts the test tree's later quote past its gold partner:
    # EVALB then pairs nothing more, and the counts stay unequal.
    gold = '(S (NP (CD ") (NN x)) (VP (VB y) (`` ") (NN z)))'
    test = '(S (NP (`` ") (NN x)) (VP (VB y) (CD ") (NN z)))'
    assert score(gold, test, QUOTES) == (ERROR, 0, 0, 0, 0, 4, 0, "words differ at word 1: gold '\"', test 'x'")


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
    assert score(gold, test, params) == expected


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


# ------------------------------------------------------------------------------ files
def test_evalb_files_max_length_and_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    gold = write(tmp_path / "gold.txt", "(S (NP (NN a) (NN b)) (VP (VB c)))\n(S (NP (NN d)) (VP (VB e)))\n")
    pred = write(tmp_path / "pred.txt", "(S (XX a) (XX b) (VP (XX c)))\n(S (NP (XX d)) (VP (XX e)))\n")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        every = evalb_files(gold, pred)
    assert (every["matched"], every["gold_brackets"], every["test_brackets"], every["sentences"]) == (5, 6, 5, 2)
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        f"EVALB {pred} vs {gold}: F1 90.91 (P 100.00, R 83.33) over 2 sentences"
    ]
    short = evalb_files(gold, pred, max_length=2)
    assert (short["matched"], short["gold_brackets"], short["test_brackets"], short["sentences"]) == (3, 3, 3, 1)


def test_evalb_sentences_messages(tmp_path: Path) -> None:
    gold = write(tmp_path / "g.txt", "(S (NN a))\n\n(S (NN b))\n")
    with pytest.raises(DataError) as e:
        evalb_sentences(gold, write(tmp_path / "t.txt", "(S (NN a))\n"), EvalbParams())
    assert str(e.value) == f"{gold} has 3 lines but {tmp_path / 't.txt'} has 1"
    with pytest.raises(DataError) as e:
        evalb_sentences(write(tmp_path / "bad.txt", "(S (NN a))\n(S (NN b)\n"), gold, EvalbParams())
    assert str(e.value) == f"{tmp_path / 'bad.txt'} line 2:1: unbalanced brackets (tree never closed)"
    test = write(tmp_path / "t.txt", "(S (NN x))\n\n(S (NN y))\n")
    with pytest.raises(DataError) as e:
        evalb_sentences(gold, test, EvalbParams(strict=True))
    assert str(e.value) == f"{gold}:1 vs {test}:1: words differ at word 1: gold 'a', test 'x'"
    with pytest.raises(DataError) as e:
        evalb_sentences(gold, test, EvalbParams(max_error=0))
    assert str(e.value) == (f"{gold}:3 vs {test}:3: 2 error sentences, more than MAX_ERROR 0 allows "
                            "(EVALB stops here); last: words differ at word 1: gold 'b', test 'y'")


REPORT_RULES = (
    "  Sent.                        Matched  Bracket   Cross        Correct Tag\n"
    " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy\n"
    "============================================================================\n"
)


def summary_block(title: str, figures: list[str]) -> str:
    names = ["Number of sentence", "Number of Error sentence", "Number of Skip  sentence",
             "Number of Valid sentence", "Bracketing Recall", "Bracketing Precision", "Bracketing FMeasure",
             "Complete match", "Average crossing", "No crossing", "2 or less crossing", "Tagging accuracy"]
    return f"\n-- {title} --\n" + "".join(f"{name:<26}= {value:>6}\n" for name, value in zip(names, figures))


def test_report_text_with_error_and_skip_rows(tmp_path: Path) -> None:
    gold = write(tmp_path / "g.txt", "(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))\n(S (A (P this)) (B (Q is)))\n"
                                     "(S (. .))\n(S (NP (NN x)) (VP (VB y)))\n")
    test = write(tmp_path / "t.txt", "(S (DT The) (NN cat) (VP (VBD sat)) (. .))\n(S (A (P that)) (B (Q is)))\n"
                                     "(S (. .))\n(TOP (NN x) (VB y))\n")
    params = EvalbParams(delete_labels=frozenset({".", "TOP"}), cutoff_len=3)
    assert evalb_report(gold, test, params) == (
        REPORT_RULES
        + "   1    4    0   66.67 100.00     2      3    2      0      3     3   100.00\n"
        "   2    2    1    0.00   0.00     0      0    0      0      0     0     0.00\n"
        "   3    1    2    0.00   0.00     0      0    0      0      0     0     0.00\n"
        "   4    2    0    0.00   0.00     0      3    0      0      2     2   100.00\n"
        "============================================================================\n"
        "                 33.33 100.00      2     6     2      0      5     5   100.00\n"
        "=== Summary ===\n"
        + summary_block("All", ["4", "1", "1", "2", "33.33", "100.00", "50.00", "0.00", "0.00", "100.00",
                                "100.00", "100.00"])
        + summary_block("len<=3", ["3", "1", "1", "1", "0.00", "0.00", "nan", "0.00", "0.00", "100.00",
                                   "100.00", "100.00"])
    )


def test_report_without_test_brackets_has_no_bracket_totals(tmp_path: Path) -> None:
    gold = write(tmp_path / "g.txt", "(S (NP (NN x)) (VP (VB y)))\n")
    test = write(tmp_path / "t.txt", "(TOP (NN x) (VB y))\n")
    report = evalb_report(gold, test, EvalbParams(delete_labels=frozenset({"TOP"})))
    figures = ["1", "0", "0", "1", "0.00", "0.00", "nan", "0.00", "0.00", "100.00", "100.00", "100.00"]
    assert report == (
        REPORT_RULES
        + "   1    2    0    0.00   0.00     0      3    0      0      2     2   100.00\n"
        "============================================================================\n"
        "      2     2   100.00\n"
        "=== Summary ===\n"
        + summary_block("All", figures)
        + summary_block("len<=40", figures)
    )


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
