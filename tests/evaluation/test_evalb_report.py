"""Scoring tree files: evalb_files and its log line, evalb_sentences' messages naming both
files and lines, and the report printed as EVALB prints it (rows, totals, summaries)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aiayn.errors import DataError
from aiayn.evaluation.evalb import EvalbParams, evalb_files, evalb_report, evalb_sentences

LOGGER = "aiayn.evaluation.evalb"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


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
