"""Labeled bracket scoring of constituency parses: EVALB (Sekine & Collins 1997).

By default the numbers are those of ``evalb -p COLLINS.prm gold test``, the scorer behind
every WSJ parsing F1 including the paper's (section 6.2). :class:`EvalbParams` holds the
settings of an EVALB parameter file; :meth:`EvalbParams.read` reads one, and
:meth:`EvalbParams.collins` gives this module's defaults (COLLINS.prm plus the project
choices below; ``EvalbParams.read("COLLINS.prm")`` is plain EVALB). With parameters read
from a ``.prm`` file the scorer reproduces the January 2006 bug-fix release of EVALB
(David Ellis), figure for figure on EVALB's own ``sample`` and ``bug`` test pairs
(``tests/evaluation/test_evalb_reference.py``).

EVALB's rules, as its C source applies them (the ``.prm`` key in brackets):

- words whose POS tag is a ``DELETE_LABEL`` are removed (exact tag, no equivalences),
  each tree by its *own* tags, before spans are computed; a phrase bracket whose label is
  a ``DELETE_LABEL`` (COLLINS.prm: TOP) is not counted, and neither is one left spanning
  no word;
- function tags and indices are cut from phrase labels at the first ``-`` or ``=``
  (``NP-SBJ-1`` -> ``NP``, ``NP=2`` -> ``NP``); POS tags are compared whole;
- ``EQ_LABEL a b``: a and b count as the same label (pairwise, both ways, not
  transitive), for brackets, for deleting brackets and for tags; ``EQ_WORD a b`` likewise
  for words;
- ``LABELED 1``: a bracket matches when its span *and* label match (``0``: span only);
  preterminals are not brackets; the root bracket is one (unless deleted);
- matching is greedy: each gold bracket, in the order the brackets open, takes the first
  unmatched test bracket over the same span with an equal label. Brackets are thus
  multisets: a gold tree with two NP brackets over one span needs two in the test tree for
  full recall (EVALB README, section 7.5);
- precision = matched / test brackets, recall = matched / gold brackets, summed over the
  corpus before dividing; F = 2PR / (P + R) (``nan`` when both are 0, as EVALB prints);
  complete match = share of sentences with matched == gold == test brackets. Percentages;
- crossing brackets: the number of *test* brackets that cross at least one gold bracket
  (overlap it without either containing the other); average crossing, no crossing and
  2 or less crossing are over valid sentences;
- tagging accuracy: test POS tags equal to the gold ones, over the words left after
  deletion;
- a sentence's length (for ``CUTOFF_LEN``, the ``len<=40`` summary) counts every gold
  word whose tag is not a ``DELETE_LABEL_FOR_LENGTH`` (COLLINS.prm: ``-NONE-``),
  punctuation included;
- status: 0 ok; 2 *skip*: the test tree has no word left after deletion (empty test
  line, or punctuation only); 1 *error*: the two trees' remaining words differ in number
  or in spelling. Error and skip sentences count in "Number of sentence" but add nothing
  to the figures. EVALB exits, printing no summary, at error number ``MAX_ERROR`` + 2
  (here: :class:`DataError`).

The bug fix of the 2006 release (``QUOTE_LABEL``, used by EVALB's ``new.prm``, not by
COLLINS.prm): only when the two trees' word counts differ, quote-like words (tag a
``QUOTE_LABEL``, word ``'``, ``"`` or ``/``) are paired by their position among the kept
words; where a pair's tags differ and exactly one of them is a ``DELETE_LABEL`` (a gold ``"``
whose tag deletes it, tagged ``CD`` in the test tree), the deleted word is *put
back* into its tree, so it is scored in both (as a word, for tags, inside spans); if the
counts still differ the sentence is an error. Positions are updated as EVALB does, the
put-back word's own included. Nothing else about punctuation changed in that release.

Project choices (:meth:`EvalbParams.collins` only; ``.prm`` files get plain EVALB):

- **Punctuation is found with the gold tree's POS tags, for both trees**
  (``gold_tags``). The parser here predicts structure only and its trees carry the
  placeholder tag ``XX`` (:mod:`aiayn.data.trees`); EVALB, the bug-fix release included,
  deletes each tree's words by that tree's own tags, so it would find every such sentence
  with punctuation a length mismatch (its quote fix covers only quote-like words, and puts
  words back rather than deleting them from both trees). Here ``-NONE-`` elements are
  first dropped from each tree by its own tag, the remaining words are aligned one to one,
  and a test word is deleted exactly when its gold word is. This is what EVALB reports
  when the test tree carries the gold tags, which is how such output is scored; tagging
  accuracy still compares the test tree's own tags.
- The unlabeled outer bracket of ``.mrg`` files, ``( (S ...) )``, is deleted like TOP
  (EVALB would count it as a bracket labeled with the empty string).
- ``strict``: an error sentence raises :class:`DataError` instead of being counted, since
  in the project's own scoring misaligned words mean misaligned files.

Not reproduced: EVALB's fixed limits (200 words or brackets a sentence, 5000 characters
a line) and its recovery from unequal numbers of lines (here a :class:`DataError`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from aiayn.data.trees import TRACE_TAG, Tree, iter_trees, parse_tree, read_trees_with_lines
from aiayn.errors import DataError
from aiayn.fileio import read_text_lines

logger = logging.getLogger(__name__)

PUNCTUATION_TAGS = frozenset({",", ":", "``", "''", "."})
"""COLLINS.prm DELETE_LABEL punctuation: words with these gold POS tags are not scored."""

DELETED_BRACKETS = frozenset({"TOP", ""})
"""Phrase labels never counted: COLLINS.prm's TOP, and the ``.mrg`` unlabeled root."""

EQUIVALENT_LABELS = {"PRT": "ADVP"}
"""COLLINS.prm EQ_LABEL ADVP PRT, as a map to one representative label."""

QUOTE_WORDS = frozenset({"'", '"', "/"})
"""Words EVALB's quote fix considers (with a QUOTE_LABEL tag)."""

OK, ERROR, SKIP = 0, 1, 2
"""EVALB's sentence status codes."""

_FUNCTION_TAG = re.compile(r"[-=]")


def evalb_label(label: str) -> str:
    """The label EVALB compares under COLLINS.prm: cut at the first ``-`` or ``=``, PRT read as ADVP."""
    label = _FUNCTION_TAG.split(label, 1)[0]
    return EQUIVALENT_LABELS.get(label, label)


# ------------------------------------------------------------------------------ parameters
@dataclass(frozen=True)
class EvalbParams:
    """The settings of an EVALB parameter file; the defaults are EVALB's built-in ones."""

    debug: int = 0
    """DEBUG: read and kept, has no effect here."""
    max_error: int = 10
    """MAX_ERROR: EVALB stops at the error after this many (here: :class:`DataError`)."""
    cutoff_len: int = 40
    """CUTOFF_LEN: the second summary covers sentences of at most this length."""
    labeled: bool = True
    """LABELED: brackets match by span and label (False: by span only)."""
    delete_labels: frozenset[str] = frozenset()
    """DELETE_LABEL: POS tags whose words are removed; phrase labels not counted."""
    delete_labels_for_length: frozenset[str] = frozenset()
    """DELETE_LABEL_FOR_LENGTH: POS tags not counted in a sentence's length."""
    quote_labels: frozenset[str] = frozenset()
    """QUOTE_LABEL: tags of quote-like words the bug-fix release may put back."""
    eq_labels: tuple[tuple[str, str], ...] = ()
    """EQ_LABEL pairs: labels (and tags) counted as equal, both ways."""
    eq_words: tuple[tuple[str, str], ...] = ()
    """EQ_WORD pairs: words counted as equal, both ways."""
    gold_tags: bool = False
    """Project choice (no .prm key): delete the test tree's words by the gold tags."""
    strict: bool = False
    """Project choice (no .prm key): an error sentence raises :class:`DataError`."""

    @classmethod
    def collins(cls) -> EvalbParams:
        """This module's defaults: COLLINS.prm, the ``.mrg`` root deleted, gold tags, strict."""
        return cls(
            delete_labels=frozenset({TRACE_TAG, *PUNCTUATION_TAGS, *DELETED_BRACKETS}),
            delete_labels_for_length=frozenset({TRACE_TAG}),
            eq_labels=tuple((b, a) for a, b in EQUIVALENT_LABELS.items()),
            gold_tags=True,
            strict=True,
        )

    @classmethod
    def read(cls, path: Path | str) -> EvalbParams:
        """Read an EVALB ``.prm`` file: ``KEY value`` lines, ``#`` starts a comment line;
        an unknown key or a malformed value is a :class:`DataError` naming file and line."""
        values = _read_prm(Path(path))

        def number(key: str, default: int) -> int:
            return int(values[key][-1][0]) if key in values else default

        def labels(key: str) -> frozenset[str]:
            return frozenset(args[0] for args in values.get(key, []))

        def pairs(key: str) -> tuple[tuple[str, str], ...]:
            return tuple((args[0], args[1]) for args in values.get(key, []))

        return cls(
            debug=number("DEBUG", 0),
            max_error=number("MAX_ERROR", 10),
            cutoff_len=number("CUTOFF_LEN", 40),
            labeled=number("LABELED", 1) != 0,
            delete_labels=labels("DELETE_LABEL"),
            delete_labels_for_length=labels("DELETE_LABEL_FOR_LENGTH"),
            quote_labels=labels("QUOTE_LABEL"),
            eq_labels=pairs("EQ_LABEL"),
            eq_words=pairs("EQ_WORD"),
        )

    @cached_property
    def _label_pairs(self) -> frozenset[tuple[str, str]]:
        return frozenset(self.eq_labels) | frozenset((b, a) for a, b in self.eq_labels)

    @cached_property
    def _word_pairs(self) -> frozenset[tuple[str, str]]:
        return frozenset(self.eq_words) | frozenset((b, a) for a, b in self.eq_words)

    @cached_property
    def _deleted_brackets(self) -> frozenset[str]:
        """Phrase labels equal to a DELETE_LABEL, EQ_LABEL partners included."""
        return self.delete_labels | {b for a, b in self._label_pairs if a in self.delete_labels}

    def same_label(self, a: str, b: str) -> bool:
        """EVALB's label comparison: equal, or an EQ_LABEL pair."""
        return a == b or (a, b) in self._label_pairs

    def same_word(self, a: str, b: str) -> bool:
        """EVALB's word comparison: equal, or an EQ_WORD pair."""
        return a == b or (a, b) in self._word_pairs


_PRM_KEYS = {
    "DEBUG": 1,
    "MAX_ERROR": 1,
    "CUTOFF_LEN": 1,
    "LABELED": 1,
    "DELETE_LABEL": 1,
    "DELETE_LABEL_FOR_LENGTH": 1,
    "QUOTE_LABEL": 1,
    "EQ_LABEL": 2,
    "EQ_WORD": 2,
}
"""The keys of an EVALB parameter file, with how many values each takes."""
_INTEGER_KEYS = frozenset({"DEBUG", "MAX_ERROR", "CUTOFF_LEN", "LABELED"})


def _read_prm(path: Path) -> dict[str, list[list[str]]]:
    """A parameter file's lines as key -> the values of each of its lines, checked."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise DataError(f"{path}: cannot read parameter file ({e.strerror})") from e
    values: dict[str, list[list[str]]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        key, *args = line.split() or [""]
        if not key or key.startswith("#"):
            continue
        where = f"{path}:{number}"
        if key not in _PRM_KEYS:
            raise DataError(f"{where}: unknown EVALB parameter {key!r} (known: {', '.join(_PRM_KEYS)})")
        if len(args) != _PRM_KEYS[key]:
            raise DataError(f"{where}: {key} takes {_PRM_KEYS[key]} value(s), got {len(args)}: {' '.join(args)!r}")
        if key in _INTEGER_KEYS and not re.fullmatch(r"[+-]?\d+", args[0]):
            raise DataError(f"{where}: {key} needs an integer, got {args[0]!r}")
        values.setdefault(key, []).append(args)
    return values


# ------------------------------------------------------------------------------ sentences
def _percent(part: int, whole: int) -> float:
    """100 part / whole, 0 when whole is 0 (EVALB's convention for empty counts)."""
    return 100.0 * part / whole if whole else 0.0


class _BracketFigures:
    """Recall and precision from bracket counts (a sentence's, or a corpus's)."""

    matched: int
    gold_brackets: int
    test_brackets: int

    @property
    def recall(self) -> float:
        return _percent(self.matched, self.gold_brackets)

    @property
    def precision(self) -> float:
        return _percent(self.matched, self.test_brackets)


@dataclass(frozen=True)
class SentenceScore(_BracketFigures):
    """EVALB's figures for one sentence (one row of its table)."""

    length: int
    """Gold words except DELETE_LABEL_FOR_LENGTH ones (``-NONE-``): EVALB's ``Len.``."""
    gold_brackets: int
    test_brackets: int
    matched: int
    status: int = OK
    """0 ok, 1 error (words differ in number or spelling), 2 skip (no test word left)."""
    crossing: int = 0
    words: int = 0
    """Gold words left after deletion (for error and skip sentences too, as EVALB's
    original build printed them; the 2006 build prints 0 there)."""
    correct_tags: int = 0
    sentence_id: int = 0
    """1-based position in the corpus (EVALB's ``ID``, its line number); 0 if unknown."""
    error: str = ""
    """Why the sentence is an error or is skipped."""

    @property
    def skipped(self) -> bool:
        return self.status == SKIP

    @property
    def exact(self) -> bool:
        return self.matched == self.gold_brackets == self.test_brackets

    @property
    def tag_accuracy(self) -> float:
        return 100.0 * self.correct_tags / self.words if self.words and self.status == OK else 0.0


@dataclass
class _FullTree:
    """One tree (or one EVALB line: a forest) before deletion, over all its words."""

    words: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    spans: list[list] = field(default_factory=list)
    """[label, start, end] per phrase bracket, in the order the brackets open."""
    opened_before: list[int] = field(default_factory=list)
    """Per word: how many brackets opened before it."""


def _read(forest: Iterable[Tree], drop_traces: bool) -> _FullTree:
    """Words, tags and bracket spans as EVALB reads them. Iterative: predicted trees can be
    hundreds of brackets deep."""
    full = _FullTree()
    for tree in forest:
        # (node, -1) enters a node; (node, k) closes bracket k.
        stack: list[tuple[Tree, int]] = [(tree, -1)]
        while stack:
            node, k = stack.pop()
            if k >= 0:
                full.spans[k][2] = len(full.words)
            elif node.is_preterminal:
                if not (drop_traces and node.label == TRACE_TAG):
                    full.words.append(node.word or "")
                    full.tags.append(node.label)
                    full.opened_before.append(len(full.spans))
            else:
                full.spans.append([node.label, len(full.words), len(full.words)])
                stack.append((node, len(full.spans) - 1))
                stack.extend((child, -1) for child in reversed(node.children))
    return full


@dataclass
class _Quote:
    """A quote-like word as the bug-fix EVALB records it."""

    index: int  # its position among the kept words (where it goes if put back)
    opened_before: int  # brackets opened before it: these and later ones shift if put back
    enclosing: list[int]  # brackets open around it: their end moves if put back
    word: str
    tag: str


@dataclass
class _Side:
    """One tree after deletion: kept words and tags, brackets over kept words."""

    words: list[str]
    tags: list[str]
    brackets: list[list]
    quotes: list[_Quote]


def _own_keep(full: _FullTree, params: EvalbParams) -> list[bool]:
    return [tag not in params.delete_labels for tag in full.tags]


def _side(full: _FullTree, keep: list[bool], params: EvalbParams) -> _Side:
    kept_before = [0]
    for k in keep:
        kept_before.append(kept_before[-1] + k)
    quotes = [
        _Quote(
            kept_before[i],
            full.opened_before[i],
            [k for k in range(full.opened_before[i]) if full.spans[k][2] > i],
            word,
            tag,
        )
        for i, (word, tag) in enumerate(zip(full.words, full.tags))
        if tag in params.quote_labels and word in QUOTE_WORDS
    ]
    return _Side(
        words=[w for w, k in zip(full.words, keep) if k],
        tags=[t for t, k in zip(full.tags, keep) if k],
        brackets=[[label, kept_before[s], kept_before[e]] for label, s, e in full.spans],
        quotes=quotes,
    )


def _put_back(side: _Side, quote: _Quote) -> None:
    """The bug-fix release's reinsertion of a deleted quote-like word."""
    side.words.insert(quote.index, quote.word)
    side.tags.insert(quote.index, quote.tag)
    for bracket in side.brackets[quote.opened_before :]:
        bracket[1] += 1
        bracket[2] += 1
    for k in quote.enclosing:
        side.brackets[k][2] += 1


def _fix_quotes(gold: _Side, test: _Side, params: EvalbParams) -> None:
    """Pair quote-like words by kept position; put back the deleted one of a pair whose
    tags differ. Positions are updated as EVALB does (the put-back word's own included)."""
    deleted = params.delete_labels
    for i, test_quote in enumerate(test.quotes):
        index = test_quote.index
        for j, gold_quote in enumerate(gold.quotes):
            if gold_quote.index != index or gold_quote.tag == test_quote.tag:
                continue
            if gold_quote.tag in deleted and test_quote.tag not in deleted:
                _put_back(gold, gold_quote)
                for q in gold.quotes[j:]:
                    q.index += 1
            elif test_quote.tag in deleted and gold_quote.tag not in deleted:
                _put_back(test, test_quote)
                for q in test.quotes[i:]:
                    q.index += 1


class _Unscored(Exception):
    """A sentence EVALB reports as error or skip."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _check_words(gold: list[str], test: list[str], params: EvalbParams) -> None:
    if len(gold) != len(test):
        raise _Unscored(ERROR, f"length mismatch: gold tree has {len(gold)} words, test tree {len(test)}")
    for i, (g, t) in enumerate(zip(gold, test)):
        if not params.same_word(g, t):
            raise _Unscored(ERROR, f"words differ at word {i + 1}: gold {g!r}, test {t!r}")


def _evalb_sides(gold_full: _FullTree, test_full: _FullTree, params: EvalbParams) -> tuple[_Side, _Side]:
    """EVALB: each tree loses the words its own tags delete."""
    gold = _side(gold_full, _own_keep(gold_full, params), params)
    test = _side(test_full, _own_keep(test_full, params), params)
    if not test.words:
        raise _Unscored(SKIP, "no word left in the test tree")
    if len(gold.words) != len(test.words):
        _fix_quotes(gold, test, params)
    _check_words(gold.words, test.words, params)
    return gold, test


def _gold_tag_sides(gold_full: _FullTree, test_full: _FullTree, params: EvalbParams) -> tuple[_Side, _Side]:
    """Project choice: words aligned one to one, deleted where the gold tag says so."""
    _check_words(gold_full.words, test_full.words, params)
    keep = _own_keep(gold_full, params)
    gold, test = _side(gold_full, keep, params), _side(test_full, keep, params)
    if not gold.words:
        raise _Unscored(SKIP, "no word left after deletion")
    return gold, test


def _scored_brackets(side: _Side, params: EvalbParams) -> list[tuple[str, int, int]]:
    """Counted brackets, labels cut at ``-``/``=``, in opening order."""
    out = []
    for label, start, end in side.brackets:
        label = _FUNCTION_TAG.split(label, 1)[0]
        if start < end and label not in params._deleted_brackets:
            out.append((label, start, end))
    return out


def _matched(gold: list[tuple[str, int, int]], test: list[tuple[str, int, int]], params: EvalbParams) -> int:
    """EVALB's greedy matching: each gold bracket takes the first free equal test bracket."""
    free: dict[tuple[int, int], list[str | None]] = {}
    for label, start, end in test:
        free.setdefault((start, end), []).append(label)
    matched = 0
    for label, start, end in gold:
        candidates = free.get((start, end), [])
        for k, other in enumerate(candidates):
            if other is not None and (not params.labeled or params.same_label(label, other)):
                candidates[k] = None
                matched += 1
                break
    return matched


def _crossing(gold: list[tuple[str, int, int]], test: list[tuple[str, int, int]]) -> int:
    """Test brackets (s, e) crossing a gold one (a, b): a < s < b < e or s < a < e < b."""
    n = max((end for _, _, end in gold + test), default=0) + 1
    # min_end[x]: smallest b of a gold bracket with a < x < b; max_start[x]: largest such a.
    min_end, max_start = [n] * n, [-1] * n
    for _, a, b in gold:
        for x in range(a + 1, b):
            min_end[x] = min(min_end[x], b)
            max_start[x] = max(max_start[x], a)
    return sum(min_end[s] < e or max_start[e] > s for _, s, e in test)


def _score_full_trees(gold_full: _FullTree, test_full: _FullTree, params: EvalbParams) -> SentenceScore:
    length = sum(tag not in params.delete_labels_for_length for tag in gold_full.tags)
    try:
        sides = (_gold_tag_sides if params.gold_tags else _evalb_sides)(gold_full, test_full, params)
    except _Unscored as e:
        if params.strict and e.status == ERROR:
            raise DataError(str(e)) from None
        words = sum(_own_keep(gold_full, params))
        return SentenceScore(length, 0, 0, 0, status=e.status, words=words, error=str(e))
    gold, test = sides
    gold_brackets, test_brackets = _scored_brackets(gold, params), _scored_brackets(test, params)
    return SentenceScore(
        length=length,
        gold_brackets=len(gold_brackets),
        test_brackets=len(test_brackets),
        matched=_matched(gold_brackets, test_brackets, params),
        crossing=_crossing(gold_brackets, test_brackets),
        words=len(gold.words),
        correct_tags=sum(params.same_label(g, t) for g, t in zip(gold.tags, test.tags)),
    )


def _score_forests(gold: Sequence[Tree], test: Sequence[Tree], params: EvalbParams) -> SentenceScore:
    drop = params.gold_tags  # gold-tag alignment ignores -NONE- elements in both trees
    return _score_full_trees(_read(gold, drop), _read(test, drop), params)


def score_sentence(gold: Tree, test: Tree, *, params: EvalbParams | None = None) -> SentenceScore:
    """EVALB's figures for ``test`` against ``gold`` (module docstring has the rules).

    With the default :meth:`EvalbParams.collins`, mismatched words raise :class:`DataError`.
    """
    return _score_forests([gold], [test], params or EvalbParams.collins())


# ------------------------------------------------------------------------------ corpus
@dataclass(frozen=True)
class EvalbSummary(_BracketFigures):
    """EVALB's ``=== Summary ===`` block: counts, and the figures as properties."""

    sentences: int
    errors: int
    skipped: int
    matched: int
    gold_brackets: int
    test_brackets: int
    complete_sentences: int
    crossing: int
    no_crossing_sentences: int
    two_or_less_crossing_sentences: int
    words: int
    correct_tags: int

    @property
    def valid(self) -> int:
        return self.sentences - self.errors - self.skipped

    @property
    def f_measure(self) -> float:
        """2PR / (P + R); ``nan`` when both are 0, as EVALB prints."""
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else math.nan

    def _share(self, count: int) -> float:
        return 100.0 * count / self.valid if self.valid else 0.0

    @property
    def complete_match(self) -> float:
        return self._share(self.complete_sentences)

    @property
    def average_crossing(self) -> float:
        return self.crossing / self.valid if self.valid else 0.0

    @property
    def no_crossing(self) -> float:
        return self._share(self.no_crossing_sentences)

    @property
    def two_or_less_crossing(self) -> float:
        return self._share(self.two_or_less_crossing_sentences)

    @property
    def tagging_accuracy(self) -> float:
        return 100.0 * self.correct_tags / self.words if self.words else 0.0


def evalb_summary(scores: Sequence[SentenceScore], max_length: int | None = None) -> EvalbSummary:
    """EVALB's summary of ``scores``; ``max_length`` keeps sentences of at most that length
    (EVALB's ``len<=CUTOFF_LEN`` block)."""
    counted = [s for s in scores if max_length is None or s.length <= max_length]
    valid = [s for s in counted if s.status == OK]
    return EvalbSummary(
        sentences=len(counted),
        errors=sum(s.status == ERROR for s in counted),
        skipped=sum(s.status == SKIP for s in counted),
        matched=sum(s.matched for s in valid),
        gold_brackets=sum(s.gold_brackets for s in valid),
        test_brackets=sum(s.test_brackets for s in valid),
        complete_sentences=sum(s.exact for s in valid),
        crossing=sum(s.crossing for s in valid),
        no_crossing_sentences=sum(s.crossing == 0 for s in valid),
        two_or_less_crossing_sentences=sum(s.crossing <= 2 for s in valid),
        words=sum(s.words for s in valid),
        correct_tags=sum(s.correct_tags for s in valid),
    )


def summarize(scores: Sequence[SentenceScore], max_length: int | None = None) -> dict:
    """Corpus totals as EVALB's summary: percentages plus the raw counts.

    ``max_length`` keeps only sentences of at most that many words (EVALB's ``len<=40``).
    ``sentences`` counts the valid ones, ``skipped`` the others (error sentences included;
    :func:`evalb_summary` tells them apart). ``f1`` is 0.0 where EVALB prints ``nan``.
    """
    s = evalb_summary(scores, max_length)
    return {
        "precision": s.precision,
        "recall": s.recall,
        "f1": 0.0 if math.isnan(s.f_measure) else s.f_measure,
        "exact_match": s.complete_match,
        "sentences": s.valid,
        "skipped": s.sentences - s.valid,
        "matched": s.matched,
        "gold_brackets": s.gold_brackets,
        "test_brackets": s.test_brackets,
    }


def _as_tree(tree: Tree | str, source: str) -> Tree:
    return tree if isinstance(tree, Tree) else parse_tree(tree, source)


def _score_all(
    pairs: Iterable[tuple[Sequence[Tree], Sequence[Tree]]],
    params: EvalbParams,
    where: Callable[[int], str],
) -> list[SentenceScore]:
    """Score sentence pairs; ``where(i)`` names pair i (0-based) in error messages."""
    scores: list[SentenceScore] = []
    errors = 0
    for i, (gold, test) in enumerate(pairs):
        try:
            score = _score_forests(gold, test, params)
        except DataError as e:
            raise DataError(f"{where(i)}: {e}") from e
        scores.append(replace(score, sentence_id=i + 1))
        if score.status == ERROR:
            logger.debug("%s: %s", where(i), score.error)
            errors += 1
            if errors > params.max_error + 1:  # EVALB exits, printing no summary
                raise DataError(
                    f"{where(i)}: {errors} error sentences, more than MAX_ERROR {params.max_error} "
                    f"allows (EVALB stops here); last: {score.error}"
                )
    return scores


def evalb(
    gold_trees: Sequence[Tree | str],
    pred_trees: Sequence[Tree | str],
    *,
    max_length: int | None = None,
    params: EvalbParams | None = None,
) -> dict:
    """Score predicted trees against gold trees, sentence i against sentence i.

    Trees may be :class:`Tree` objects or bracketed strings. Returns ``precision``,
    ``recall``, ``f1``, ``exact_match`` (percentages), ``sentences`` (scored),
    ``skipped``, and the bracket counts ``matched``, ``gold_brackets``,
    ``test_brackets``. ``params`` defaults to :meth:`EvalbParams.collins`.
    """
    if len(gold_trees) != len(pred_trees):
        raise DataError(f"{len(gold_trees)} gold trees but {len(pred_trees)} predicted trees")
    pairs = (
        ([_as_tree(g, f"gold sentence {i + 1}")], [_as_tree(p, f"predicted sentence {i + 1}")])
        for i, (g, p) in enumerate(zip(gold_trees, pred_trees))
    )
    scores = _score_all(pairs, params or EvalbParams.collins(), lambda i: f"sentence {i + 1}")
    return summarize(scores, max_length)


def evalb_files(
    gold_path: Path | str,
    pred_path: Path | str,
    *,
    max_length: int | None = None,
    params: EvalbParams | None = None,
) -> dict:
    """:func:`evalb` over two files of bracketed trees (one per line, or ``.mrg`` layout).

    Trees are read as trees, whatever the lines; :func:`evalb_sentences` reads EVALB's
    one-line-per-sentence layout (empty lines and several trees on a line included).
    """
    gold = read_trees_with_lines(gold_path)
    pred = read_trees_with_lines(pred_path)
    if len(gold) != len(pred):
        raise DataError(f"{gold_path} has {len(gold)} trees but {pred_path} has {len(pred)}")
    pairs = (([g], [p]) for (_, g), (_, p) in zip(gold, pred))
    scores = _score_all(
        pairs, params or EvalbParams.collins(), lambda i: f"{gold_path}:{gold[i][0]} vs {pred_path}:{pred[i][0]}"
    )
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


def _read_lines(path: Path | str) -> list[list[Tree]]:
    """EVALB's input layout: line i is sentence i, holding any number of trees (0: empty)."""
    lines = read_text_lines(path, "error", strip="eol")
    return [[tree for _, tree in iter_trees(line or "", f"{path} line {n}")] for n, line in enumerate(lines, start=1)]


def evalb_sentences(gold_path: Path | str, test_path: Path | str, params: EvalbParams) -> list[SentenceScore]:
    """Every sentence's figures, as ``evalb -p PARAMS gold test`` reads the files: one
    sentence per line (an empty line is a sentence with no words)."""
    gold, test = _read_lines(gold_path), _read_lines(test_path)
    if len(gold) != len(test):
        raise DataError(f"{gold_path} has {len(gold)} lines but {test_path} has {len(test)}")
    return _score_all(zip(gold, test), params, lambda i: f"{gold_path}:{i + 1} vs {test_path}:{i + 1}")


_HEADER = (
    "  Sent.                        Matched  Bracket   Cross        Correct Tag\n"
    " ID  Len.  Stat. Recal  Prec.  Bracket gold test Bracket Words  Tags Accracy\n"
)
_RULE = "=" * 76 + "\n"


def _report_row(s: SentenceScore) -> str:
    words, tags = (s.words, s.correct_tags) if s.status == OK else (0, 0)  # as the 2006 build
    return (
        f"{s.sentence_id:4d}  {s.length:3d}    {s.status:d}  {s.recall:6.2f} {s.precision:6.2f}   "
        f"{s.matched:3d}    {s.gold_brackets:3d}  {s.test_brackets:3d}    {s.crossing:3d}   "
        f"{words:4d}  {tags:4d}   {s.tag_accuracy:6.2f}\n"
    )


def _report_summary(title: str, s: EvalbSummary) -> str:
    figures = [
        ("Number of sentence", f"{s.sentences:6d}"),
        ("Number of Error sentence", f"{s.errors:6d}"),
        ("Number of Skip  sentence", f"{s.skipped:6d}"),
        ("Number of Valid sentence", f"{s.valid:6d}"),
        ("Bracketing Recall", f"{s.recall:6.2f}"),
        ("Bracketing Precision", f"{s.precision:6.2f}"),
        ("Bracketing FMeasure", f"{s.f_measure:6.2f}"),
        ("Complete match", f"{s.complete_match:6.2f}"),
        ("Average crossing", f"{s.average_crossing:6.2f}"),
        ("No crossing", f"{s.no_crossing:6.2f}"),
        ("2 or less crossing", f"{s.two_or_less_crossing:6.2f}"),
        ("Tagging accuracy", f"{s.tagging_accuracy:6.2f}"),
    ]
    return f"\n-- {title} --\n" + "".join(f"{name:<26}= {value}\n" for name, value in figures)


def evalb_report(gold_path: Path | str, test_path: Path | str, params: EvalbParams) -> str:
    """The text ``evalb -p PARAMS gold test`` prints on stdout (2006 build's layout)."""
    scores = evalb_sentences(gold_path, test_path, params)
    total = evalb_summary(scores)
    out = [_HEADER, _RULE, *map(_report_row, scores), _RULE]
    if total.gold_brackets and total.test_brackets:
        out.append(
            f"                {total.recall:6.2f} {total.precision:6.2f} {total.matched:6d} "
            f"{total.gold_brackets:5d} {total.test_brackets:5d}  {total.crossing:5d}"
        )
    out.append(f"  {total.words:5d} {total.correct_tags:5d}   {total.tagging_accuracy:6.2f}\n")
    out.append("=== Summary ===\n")
    out.append(_report_summary("All", total))
    out.append(_report_summary(f"len<={params.cutoff_len}", evalb_summary(scores, params.cutoff_len)))
    return "".join(out)
