"""Labeled bracket scoring of constituency parses, as EVALB with COLLINS.prm.

The numbers are those of ``evalb -p COLLINS.prm gold test`` (Sekine & Collins 1997),
the scorer behind every WSJ parsing F1 including the paper's (section 6.2):

- ``LABELED 1``: a bracket matches when its span *and* label match;
- ``DELETE_LABEL TOP``, ``-NONE-``, and the punctuation tags ``, : `` '' .``: words
  with these POS tags are removed before spans are computed, and so are brackets labeled
  TOP; a bracket left spanning no word is not counted;
- function tags and indices are cut from phrase labels (``NP-SBJ-1`` -> ``NP``,
  ``NP=2`` -> ``NP``), so raw treebank trees and cleaned ones score alike;
- ``EQ_LABEL ADVP PRT``: ADVP and PRT count as the same label;
- preterminals (POS tags) are not brackets; the root bracket is one (unless TOP);
- brackets are multisets: a gold tree with two NP brackets over one span needs two in
  the test tree for full recall (EVALB README, section 7.5);
- precision = matched / test brackets, recall = matched / gold brackets, both summed over
  the corpus before dividing; F1 = 2PR / (P + R); exact match = share of sentences with
  matched == gold == test brackets. All are percentages.
- a sentence's length (for ``max_length``, EVALB's ``len<=40`` line) counts every word
  except ``-NONE-`` elements, punctuation included (``DELETE_LABEL_FOR_LENGTH -NONE-``).
- sentences where no word is left after deletion (punctuation only) are skipped, as
  EVALB skips them, and reported as ``skipped``.

Two deliberate choices, both no-ops for ordinary EVALB input:

- **Punctuation is found with the gold tree's POS tags, for both trees.** EVALB deletes
  words by each tree's own tags; the parser here predicts structure only and its trees
  carry the placeholder tag ``XX`` (:mod:`aiayn.data.trees`), so this is the same as
  EVALB on test trees given the gold tags, which is how such output is scored.
- The unlabeled outer bracket of ``.mrg`` files, ``( (S ...) )``, is deleted like TOP.

Where the two trees' words differ in number or spelling, EVALB reports an error
sentence; here that raises :class:`DataError`, since it means misaligned files.
Tagging accuracy and crossing brackets are not computed.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiayn.data.trees import TRACE_TAG, Tree, parse_tree, read_trees_with_lines
from aiayn.errors import DataError

logger = logging.getLogger(__name__)

PUNCTUATION_TAGS = frozenset({",", ":", "``", "''", "."})
"""COLLINS.prm DELETE_LABEL punctuation: words with these gold POS tags are not scored."""

DELETED_BRACKETS = frozenset({"TOP", ""})
"""Phrase labels never counted: COLLINS.prm's TOP, and the ``.mrg`` unlabeled root."""

EQUIVALENT_LABELS = {"PRT": "ADVP"}
"""COLLINS.prm EQ_LABEL ADVP PRT, as a map to one representative label."""

_FUNCTION_TAG = re.compile(r"[-=]")


def evalb_label(label: str) -> str:
    """The label EVALB compares: cut at the first ``-`` or ``=``, PRT read as ADVP."""
    label = _FUNCTION_TAG.split(label, 1)[0]
    return EQUIVALENT_LABELS.get(label, label)


@dataclass(frozen=True)
class SentenceScore:
    """EVALB's counts for one sentence."""

    length: int
    """Words except ``-NONE-`` elements (EVALB's length, for the ``len<=40`` cut)."""
    gold_brackets: int
    test_brackets: int
    matched: int
    skipped: bool = False
    """True when no word is left after deleting punctuation: EVALB skips the sentence."""

    @property
    def exact(self) -> bool:
        return self.matched == self.gold_brackets == self.test_brackets


def _analyse(tree: Tree) -> tuple[list[str], list[str], list[tuple[str, int, int]]]:
    """Words, POS tags and phrase spans (label, start, end) over the non-trace words.

    Iterative: a predicted tree can be hundreds of brackets deep.
    """
    words: list[str] = []
    tags: list[str] = []
    spans: list[tuple[str, int, int]] = []
    # (node, None) enters a node; (node, start) leaves it, its span starting at start.
    stack: list[tuple[Tree, int | None]] = [(tree, None)]
    while stack:
        node, start = stack.pop()
        if start is not None:
            spans.append((node.label, start, len(words)))
        elif node.is_preterminal:
            if node.label != TRACE_TAG:
                words.append(node.word or "")
                tags.append(node.label)
        else:
            stack.append((node, len(words)))
            stack.extend((child, None) for child in reversed(node.children))
    return words, tags, spans


def _brackets(spans: list[tuple[str, int, int]], kept_before: list[int]) -> Counter[tuple[str, int, int]]:
    """Scored brackets as a multiset, spans renumbered over the words that are kept."""
    out: Counter[tuple[str, int, int]] = Counter()
    for label, start, end in spans:
        label = evalb_label(label)
        s, e = kept_before[start], kept_before[end]
        if s < e and label not in DELETED_BRACKETS:
            out[(label, s, e)] += 1
    return out


def score_sentence(gold: Tree, test: Tree) -> SentenceScore:
    """Bracket counts of ``test`` against ``gold`` (module docstring has the rules)."""
    gold_words, gold_tags, gold_spans = _analyse(gold)
    test_words, _, test_spans = _analyse(test)
    if len(gold_words) != len(test_words):
        raise DataError(f"length mismatch: gold tree has {len(gold_words)} words, test tree {len(test_words)}")
    for i, (g, t) in enumerate(zip(gold_words, test_words)):
        if g != t:
            raise DataError(f"words differ at word {i + 1}: gold {g!r}, test {t!r}")

    # kept_before[i] = words kept among the first i, so a span (s, e) over all words
    # becomes (kept_before[s], kept_before[e]) once punctuation is gone.
    kept_before = [0]
    for tag in gold_tags:
        kept_before.append(kept_before[-1] + (tag not in PUNCTUATION_TAGS))
    if kept_before[-1] == 0:
        return SentenceScore(len(gold_words), 0, 0, 0, skipped=True)

    gold_brackets = _brackets(gold_spans, kept_before)
    test_brackets = _brackets(test_spans, kept_before)
    matched = sum((gold_brackets & test_brackets).values())
    return SentenceScore(
        length=len(gold_words),
        gold_brackets=sum(gold_brackets.values()),
        test_brackets=sum(test_brackets.values()),
        matched=matched,
    )


def summarize(scores: Sequence[SentenceScore], max_length: int | None = None) -> dict:
    """Corpus totals as EVALB's summary: percentages plus the raw counts.

    ``max_length`` keeps only sentences of at most that many words (EVALB's ``len<=40``).
    """
    counted = [s for s in scores if max_length is None or s.length <= max_length]
    valid = [s for s in counted if not s.skipped]
    matched = sum(s.matched for s in valid)
    gold = sum(s.gold_brackets for s in valid)
    test = sum(s.test_brackets for s in valid)
    precision = 100.0 * matched / test if test else 0.0
    recall = 100.0 * matched / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    exact = 100.0 * sum(s.exact for s in valid) / len(valid) if valid else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "exact_match": exact,
        "sentences": len(valid),
        "skipped": len(counted) - len(valid),
        "matched": matched,
        "gold_brackets": gold,
        "test_brackets": test,
    }


def _as_tree(tree: Tree | str, source: str) -> Tree:
    return tree if isinstance(tree, Tree) else parse_tree(tree, source)


def evalb(
    gold_trees: Sequence[Tree | str],
    pred_trees: Sequence[Tree | str],
    *,
    max_length: int | None = None,
) -> dict:
    """Score predicted trees against gold trees, sentence i against sentence i.

    Trees may be :class:`Tree` objects or bracketed strings. Returns ``precision``,
    ``recall``, ``f1``, ``exact_match`` (percentages), ``sentences`` (scored),
    ``skipped``, and the bracket counts ``matched``, ``gold_brackets``,
    ``test_brackets``.
    """
    if len(gold_trees) != len(pred_trees):
        raise DataError(f"{len(gold_trees)} gold trees but {len(pred_trees)} predicted trees")
    scores = []
    for i, (gold, pred) in enumerate(zip(gold_trees, pred_trees)):
        where = f"sentence {i + 1}"
        try:
            scores.append(score_sentence(_as_tree(gold, f"gold {where}"), _as_tree(pred, f"predicted {where}")))
        except DataError as e:
            raise DataError(f"{where}: {e}") from e
    return summarize(scores, max_length)


def evalb_files(gold_path: Path | str, pred_path: Path | str, *, max_length: int | None = None) -> dict:
    """:func:`evalb` over two files of bracketed trees (one per line, or ``.mrg`` layout)."""
    gold = read_trees_with_lines(gold_path)
    pred = read_trees_with_lines(pred_path)
    if len(gold) != len(pred):
        raise DataError(f"{gold_path} has {len(gold)} trees but {pred_path} has {len(pred)}")
    scores = []
    for (gold_line, gold_tree), (pred_line, pred_tree) in zip(gold, pred):
        try:
            scores.append(score_sentence(gold_tree, pred_tree))
        except DataError as e:
            raise DataError(f"{gold_path}:{gold_line} vs {pred_path}:{pred_line}: {e}") from e
    result = summarize(scores, max_length)
    logger.info(
        "EVALB %s vs %s: F1 %.2f (P %.2f, R %.2f) over %d sentences",
        pred_path,
        gold_path,
        result["f1"],
        result["precision"],
        result["recall"],
        result["sentences"],
    )
    return result
