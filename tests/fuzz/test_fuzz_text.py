"""Fuzzing the readers of user text: the one line reader (aiayn.fileio), the tree reader
and the tree rebuild (aiayn.data.trees), and config overrides (aiayn.config)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import strategies as st

from aiayn.config import Config, apply_overrides, to_dict
from aiayn.data.trees import PLACEHOLDER, clean_tree, is_well_formed, linearize, parse_tree, rebuild, tree_to_string
from aiayn.errors import AiaynError
from aiayn.fileio import read_text_lines

# ------------------------------------------------------------------ the line reader


def check_reader(data: bytes, tmp: Path) -> None:
    path = tmp / "in.txt"
    path.write_bytes(data)
    try:
        lines = read_text_lines(path, strip="eol")
    except AiaynError as exc:
        assert str(path) in str(exc)  # names the file (and the line)
        return
    text = data.decode("utf-8").removeprefix("\ufeff")
    expected = text.split("\n") if text else []
    if text.endswith("\n"):
        expected.pop()
    assert lines == [line.removesuffix("\r") for line in expected]


@pytest.fixture
def reader_test(fuzz, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reader")
    return fuzz(lambda data: check_reader(data, tmp),
                st.one_of(st.binary(max_size=300), st.text(max_size=200).map(lambda t: t.encode("utf-8"))))


def test_line_reader(reader_test) -> None:
    reader_test[0]()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_line_reader_long(reader_test) -> None:
    reader_test[1]()


# ------------------------------------------------------------------ trees

LABELS = st.sampled_from(["S", "NP", "VP", "PP", "NP-SBJ", "-NONE-", "XX", "ADVP"])
WORDS = st.text(alphabet=st.characters(blacklist_characters="() \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u2028\u2029"),
                min_size=1, max_size=6).filter(lambda w: w.strip() == w and w.split() == [w])


def trees(depth: int = 4) -> st.SearchStrategy[str]:
    leaf = st.tuples(LABELS, WORDS).map(lambda lw: f"({lw[0]} {lw[1]})")
    return st.recursive(leaf, lambda kids: st.tuples(LABELS, st.lists(kids, min_size=1, max_size=3)).map(
        lambda lk: f"({lk[0]} {' '.join(lk[1])})"), max_leaves=12)


def check_tree_text(text: str) -> None:
    try:
        tree = parse_tree(text)
    except AiaynError:
        return
    # Strings, not Tree ==: dataclass equality recurses, and deep trees are the point here.
    assert tree_to_string(parse_tree(tree_to_string(tree))) == tree_to_string(tree)
    cleaned = clean_tree(tree)  # iterative: a deep tree must not raise RecursionError
    if cleaned is not None:
        rebuild(linearize(cleaned), [p.word for p in cleaned.preterminals()])


def check_tree_round_trip(text: str) -> None:
    tree = parse_tree(text)
    assert tree_to_string(parse_tree(tree_to_string(tree))) == tree_to_string(tree)


@pytest.fixture
def tree_tests(fuzz):
    junk = st.text(alphabet="() XNPSab\n\t-", max_size=80)
    nested = st.integers(1, 5000).map(lambda n: "(S " * n + "x" + ")" * n)
    return fuzz(check_tree_text, st.one_of(junk, trees(), nested)), fuzz(check_tree_round_trip, trees())


def test_tree_reader(tree_tests) -> None:
    tree_tests[0][0]()
    tree_tests[1][0]()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tree_reader_long(tree_tests) -> None:
    tree_tests[0][1]()
    tree_tests[1][1]()


def test_deep_nesting_is_no_recursion_error() -> None:
    depth = sys.getrecursionlimit() * 3
    tree = parse_tree("(S " * depth + "(NN x)" + ")" * depth)
    assert tree_to_string(tree).count("(S") == depth
    cleaned = clean_tree(tree)  # iterative: a recursive walk would fail from ~900 levels
    assert cleaned is not None and [p.word for p in cleaned.preterminals()] == ["x"]


SYMBOLS = st.sampled_from(["(S", ")S", "(NP", ")NP", "(VP", ")VP", PLACEHOLDER, "<unk>", ")", "("])


def _closers_labeled(tokens: list[str]) -> list[str]:
    """``tokens`` with each bare ``)`` written as its opener's ``)LABEL``."""
    out, open_labels = [], []
    for tok in tokens:
        if tok.startswith("(") and len(tok) > 1:
            open_labels.append(tok[1:])
        elif tok.startswith(")"):
            tok = ")" + open_labels.pop()
        out.append(tok)
    return out


def check_rebuild(tokens: list[str], words: list[str]) -> None:
    tree = rebuild(tokens, words)
    if is_well_formed(tokens, len(words)):
        # Nothing to repair: the tree is exactly the one predicted.
        assert linearize(tree) == _closers_labeled(tokens)
    # Whatever the model said, the rebuilt tree covers exactly the input words, in order.
    text = tree_to_string(tree)
    leaves = [tok.rstrip(")") for tok in text.split() if not tok.startswith("(")]
    assert leaves == words


def _tokens_of(node: str | tuple) -> list[str]:
    if isinstance(node, str):
        return [node]
    label, children, bare_closer = node
    return ["(" + label, *(tok for child in children for tok in _tokens_of(child)),
            ")" if bare_closer else ")" + label]


LABELS = st.sampled_from(["S", "NP", "VP"])
# Predictions that need no repair: a bracketed tree over placeholders, closers bare or labeled.
WELL_FORMED = st.tuples(LABELS, st.lists(st.recursive(
    st.just(PLACEHOLDER), lambda kids: st.tuples(LABELS, st.lists(kids, min_size=1, max_size=3), st.booleans()),
    max_leaves=12), min_size=1, max_size=3), st.booleans()).map(_tokens_of)


@pytest.fixture
def rebuild_test(fuzz):
    word = st.sampled_from(["a", "dog", "-LRB-", "x1", "runs"])
    well_formed = WELL_FORMED.map(lambda toks: (toks, ["w"] * toks.count(PLACEHOLDER)))
    return fuzz(lambda pair: check_rebuild(*pair),
                st.one_of(st.tuples(st.lists(SYMBOLS, max_size=40), st.lists(word, min_size=1, max_size=12)),
                          well_formed))


def test_well_formed_predictions_are_rebuilt_as_predicted(fuzz) -> None:
    def check(tokens: list[str]) -> None:
        assert is_well_formed(tokens, tokens.count(PLACEHOLDER))
        check_rebuild(tokens, ["w"] * tokens.count(PLACEHOLDER))

    fuzz(check, WELL_FORMED)[0]()


def test_rebuild_covers_the_words(rebuild_test) -> None:
    rebuild_test[0]()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rebuild_covers_the_words_long(rebuild_test) -> None:
    rebuild_test[1]()


# ------------------------------------------------------------------ config overrides

FIELDS = [f"{section}.{name}" for section, fields in to_dict(Config()).items() for name in fields]


def check_override(key: str, value: str) -> None:
    try:
        cfg = apply_overrides(Config(), [f"{key}={value}"])
    except AiaynError:
        return
    cfg.validate()


@pytest.fixture
def override_test(fuzz):
    keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=20))
    values = st.one_of(st.text(max_size=30), st.sampled_from(["nan", "inf", "-1", "1e400", "[1, 2]", "{a: 1}",
                                                             "!!python/object:os.system x", "*a", "&a 1", "~",
                                                             "0x10", "1_000", ".5", "yes", "null"]))
    return fuzz(check_override, keys, values)


def test_config_overrides(override_test) -> None:
    override_test[0]()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_config_overrides_long(override_test) -> None:
    override_test[1]()
