"""Exact messages and fields of aiayn.evaluation.bleu (the scores themselves: test_bleu.py,
test_tokenized_bleu.py)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from aiayn.errors import DataError
from aiayn.evaluation.bleu import corpus_scores, read_lines, tokenized_bleu


@pytest.mark.parametrize(("hyps", "refs", "verbose"), [
    (["a"], ["a"], "100.0/0.0/0.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 1 ref_len = 1)"),
    (["a b c d e f", "x"], ["a b c d e g h", "x"],
     "85.7/80.0/75.0/66.7 (BP = 0.867 ratio = 0.875 hyp_len = 7 ref_len = 8)"),
    ([""], [""], "0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 0.000 hyp_len = 0 ref_len = 0)"),
])
def test_bleu_verbose(hyps: list[str], refs: list[str], verbose: str) -> None:
    scores = corpus_scores(hyps, refs)
    assert scores["bleu_verbose"] == verbose
    assert scores["n_sentences"] == len(hyps)


def test_target_language_picks_sacrebleus_tokenizer() -> None:
    assert "|tok:zh|" in corpus_scores(["你好世界"], ["你好世界"], tgt_lang="zh")["signature"]
    assert "|tok:13a|" in corpus_scores(["a b"], ["a b"], tgt_lang="de")["signature"]
    assert "|tok:13a|" in corpus_scores(["a b"], ["a b"])["signature"]


@pytest.mark.parametrize(("refs", "error", "message"), [
    ("a b", TypeError, "refs: expected a list of reference lines or a list of reference streams"),
    ([], DataError, "no references given"),
    (["a", "b"], DataError, "reference set 1 has 2 lines but there are 1 hypotheses; the line counts must match"),
])
def test_reference_errors(refs, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        corpus_scores(["a"], refs)


@pytest.mark.parametrize("lang", [None, "", " ", "_de"])
def test_tokenized_bleu_needs_the_target_language(lang: str | None) -> None:
    message = ("tokenized BLEU needs the target language (it picks the Moses tokenizer's rules and turns on "
               "compound splitting for German)")
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        tokenized_bleu(["a"], ["a"], lang)


def test_tokenized_bleu_does_not_warn_about_tokenized_input(caplog: pytest.LogCaptureFixture) -> None:
    # The text is tokenized on purpose: sacreBLEU's "100 lines that end in a tokenized
    # period" warning must not fire.
    lines = ["Das Haus ist alt.", "Der Hund schläft."] * 60
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        score, _ = tokenized_bleu(lines, lines, "de")
    assert score == pytest.approx(100.0)
    assert caplog.records == []


def test_read_lines_keeps_leading_whitespace(tmp_path: Path) -> None:
    # As sacreBLEU's command line: only the trailing whitespace goes.
    path = tmp_path / "hyp.txt"
    path.write_text("  indented line \t\n\tx\n", encoding="utf-8")
    assert read_lines(path) == ["  indented line", "\tx"]
