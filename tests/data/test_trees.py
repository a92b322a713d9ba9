"""Constituency trees (aiayn.data.trees): reading, cleaning, linearizing, rebuilding.

Small hand-made cases pin each rule of the module docstring to the exact value, message or
tree it produces; round trips over the treebank sample and random token soups check that
the rules hold together.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import aiayn
from aiayn.data.trees import (
    PLACEHOLDER,
    Tree,
    as_placeholders,
    clean_tree,
    flat_tree,
    is_well_formed,
    iter_trees,
    linearize,
    parse_tree,
    read_trees,
    read_trees_with_lines,
    rebuild,
    right_branching_tree,
    strip_label,
    tree_to_string,
)
from aiayn.errors import DataError

LOGGER = "aiayn.data.trees"

# The offline data mirror (real corpora): $AIAYN_DATA_MIRROR alone, which .ci/run sets. Unset, a
# path that exists nowhere and names the variable, so the tests that need data skip saying so.
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR") or "/AIAYN_DATA_MIRROR-is-not-set")
PTB_DIR = MIRROR / "ptb-sample"
PTB_FILES = PTB_DIR / "combined"

needs_ptb = pytest.mark.skipif(not PTB_FILES.is_dir(), reason=f"the data mirror has no {PTB_FILES}")


@pytest.fixture(scope="module")
def sample_trees() -> list[Tree]:
    """Every raw tree of the 10% WSJ sample (read once for the module)."""
    trees: list[Tree] = []
    for path in sorted(PTB_FILES.glob("wsj_*.mrg")):
        trees.extend(read_trees(path))
    return trees


MRG = """\
( (S
    (NP-SBJ-1 (NNP Pierre) (NNP Vinken) )
    (VP (MD will)
      (VP (VB join)
        (NP (DT the) (NN board) )))
    (. .) ))
( (S
    (NP-SBJ (NNP Mr.) (NNP Vinken) )
    (VP (VBZ is)
      (NP-PRD (NN chairman) ))
    (. .) ))
"""


def check_valid(tree: Tree, words: list[str]) -> None:
    """A usable parse: labeled nodes, non-empty constituents, exactly ``words`` as leaves."""
    assert tree.leaves() == words
    assert not tree.is_preterminal
    stack = [tree]
    while stack:
        node = stack.pop()
        assert node.label and not any(c.isspace() or c in "()" for c in node.label)
        if node.is_preterminal:
            assert not node.children
        else:
            assert node.children, f"empty constituent {node.label}"
            stack.extend(node.children)


def xx(*words: str) -> list[Tree]:
    """Preterminals tagged XX, as :func:`rebuild` makes them without tags."""
    return [Tree("XX", [], w) for w in words]


# ------------------------------------------------------------------------------- reading
def test_reader_multi_line_multi_tree(tmp_path: Path) -> None:
    path = tmp_path / "two.mrg"
    path.write_text(MRG, encoding="utf-8")
    with_lines = read_trees_with_lines(path)
    assert [line for line, _ in with_lines] == [1, 7]
    first, second = read_trees(path)
    assert first.label == "" and first.children[0].label == "S"
    assert first.leaves() == ["Pierre", "Vinken", "will", "join", "the", "board", "."]
    assert first.tags() == ["NNP", "NNP", "MD", "VB", "DT", "NN", "."]
    assert second.leaves() == ["Mr.", "Vinken", "is", "chairman", "."]


def test_reader_one_tree_per_line_and_string_round_trip() -> None:
    text = "(S (NP (DT the) (NN cat)) (VP (VBD sat)))"
    tree = parse_tree(text)
    assert tree_to_string(tree) == text
    assert str(tree) == text
    assert parse_tree(tree_to_string(tree)) == tree


@needs_ptb
def test_reader_on_sample(sample_trees: list[Tree]) -> None:
    assert len(read_trees(PTB_FILES / "wsj_0001.mrg")) == 2
    assert len(sample_trees) == 3914


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("(S (NP (DT the)\n(NN cat)", "f.mrg:1: unbalanced brackets (tree never closed)"),
        ("(S (NN a))\n(S\n(NP (DT the)", "f.mrg:2: unbalanced brackets (tree never closed)"),
        ("\n\n(S", "f.mrg:3: unbalanced brackets (tree never closed)"),
        ("(S (NP (DT the)))\n)", "f.mrg:2: closing bracket with no open bracket"),
        ("(S (NP (DT the)))\nstray", "f.mrg:2: text outside brackets: 'stray'"),
        ("(S\n(NP (DT the) word))",
         "f.mrg:2: node 'NP' has more than one word or mixes words and constituents (at 'word')"),
        ("(S (DT the extra))",
         "f.mrg:1: node 'DT' has more than one word or mixes words and constituents (at 'extra')"),
        ("(S\n (NP x\n (DT the)))", "f.mrg:3: node 'NP' mixes a word and constituents"),
        ("(S\n(\n))", "f.mrg:2: empty brackets '()'"),
        ("(S ())", "f.mrg:1: empty brackets '()'"),
    ],
)
def test_reader_messages_exactly(text: str, message: str) -> None:
    with pytest.raises(DataError) as e:
        list(iter_trees(text, "f.mrg"))
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("(A (B c))(D (E f))", "src.txt: expected one tree, found 2"),
        ("", "src.txt: expected one tree, found 0"),
        ("(S (NP", "src.txt:1: unbalanced brackets (tree never closed)"),
    ],
)
def test_parse_tree_names_its_source(text: str, message: str) -> None:
    with pytest.raises(DataError) as e:
        parse_tree(text, "src.txt")
    assert str(e.value) == message


@pytest.mark.parametrize("read", [parse_tree, lambda text: list(iter_trees(text))])
def test_default_source_name(read: Callable[[str], object]) -> None:
    with pytest.raises(DataError) as e:
        read("(S (NN x)))")
    assert str(e.value) == "<string>:1: closing bracket with no open bracket"


def test_reading_does_not_depend_on_the_locale(tmp_path: Path) -> None:
    # Under an ASCII locale (no UTF-8 mode, no locale coercion) a UTF-8 treebank still reads.
    path = tmp_path / "utf8.mrg"
    path.write_text("(S (NN café) (NN naïve))\n", encoding="utf-8")
    code = "import sys; from aiayn.data.trees import read_trees; print(ascii(str(read_trees(sys.argv[1])[0])))"
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0",
           "PYTHONPATH": str(Path(aiayn.__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True,
                          check=False)
    assert (done.returncode, done.stdout) == (0, ascii(str(read_trees(path)[0])) + "\n"), done.stderr
    assert str(read_trees(path)[0]) == "(S (NN café) (NN naïve))"


def test_read_errors_exactly(tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        read_trees(tmp_path / "nope.mrg")
    assert str(e.value) == f"{tmp_path / 'nope.mrg'}: no such file"
    with pytest.raises(DataError) as e:
        read_trees_with_lines(tmp_path / "nope.mrg")
    assert str(e.value) == f"{tmp_path / 'nope.mrg'}: no such file"
    unbalanced = tmp_path / "open.mrg"
    unbalanced.write_text("(S (NN a))\n(S (NN b)\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_trees_with_lines(unbalanced)
    assert str(e.value) == f"{unbalanced}:2: unbalanced brackets (tree never closed)"
    bad = tmp_path / "latin1.mrg"
    bad.write_bytes(b"(S (NN caf\xe9))")
    with pytest.raises(DataError) as e:
        read_trees(bad)
    assert str(e.value) == f"{bad}: not valid UTF-8 (invalid continuation byte at byte 10)"


# ------------------------------------------------------------------------------ cleaning
@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ("NP-SBJ-1", "NP"),
        ("PP-LOC=2", "PP"),
        ("NP=3", "NP"),
        ("S-TPC-1", "S"),
        ("NP", "NP"),
        ("-NONE-", "-NONE-"),
        ("-LRB-", "-LRB-"),
        ("PRP$", "PRP$"),
        ("ADVP|PRT", "ADVP"),
        ("-X|Y", "-X|Y"),  # a label starting with "-" is whole, "|" included
        ("ADVP|PRT|NP", "ADVP"),  # the first of several alternatives
        ("=X", "=X"),  # nothing before the tag: kept as it is
        ("NP-SBJ=2-1", "NP"),
    ],
)
def test_strip_label(label: str, expected: str) -> None:
    assert strip_label(label) == expected


def test_clean_removes_empty_elements_and_emptied_constituents() -> None:
    # The example of the EVALB README, section 7.1.
    raw = parse_tree("( (S (NP-SBJ (PRP He)) (VP (VBD reported) (SBAR (-NONE- 0) (S (-NONE- *T*-1)))) (. .)))")
    assert tree_to_string(clean_tree(raw)) == "(S (NP (PRP He)) (VP (VBD reported)) (. .))"


def test_clean_strips_tags_keeps_pos_and_brackets() -> None:
    raw = parse_tree(
        "( (S (NP-SBJ-1 (-LRB- -LRB-) (NNP Foo) (-RRB- -RRB-)) (VP (VBD gave) (ADVP|PRT (RB up))"
        " (NP-TMP=2 (NN today))) (. .)))"
    )
    assert tree_to_string(clean_tree(raw)) == (
        "(S (NP (-LRB- -LRB-) (NNP Foo) (-RRB- -RRB-)) (VP (VBD gave) (ADVP (RB up)) (NP (NN today))) (. .))"
    )


def test_clean_root_wrappers() -> None:
    assert clean_tree(parse_tree("(TOP (S (NN x)))")).label == "S"
    # A wrapper over a trace and a tree: the trace goes first, then the wrapper.
    assert tree_to_string(clean_tree(parse_tree("( (-NONE- *) (S (NN x)))"))) == "(S (NN x))"
    # A wrapper that holds several pieces, or a bare word, becomes TOP.
    assert tree_to_string(clean_tree(parse_tree("( (NP (NN x)) (. .))"))) == "(TOP (NP (NN x)) (. .))"
    assert tree_to_string(clean_tree(parse_tree("( (NN x))"))) == "(TOP (NN x))"
    assert clean_tree(parse_tree("( (S (-NONE- *)))")) is None


def test_clean_does_not_modify_input() -> None:
    raw = parse_tree("( (S (NP-SBJ (-NONE- *)) (VP (VB go))))")
    before = tree_to_string(raw)
    clean_tree(raw)
    assert tree_to_string(raw) == before


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("( (S (NP-SBJ (NN x)) (VP (-NONE- *) (VB y))))", Tree("S", [Tree("NP", [Tree("NN", [], "x")]),
                                                                     Tree("VP", [Tree("VB", [], "y")])])),
        # a bare preterminal gets a TOP root over it
        ("(NN x)", Tree("TOP", [Tree("NN", [], "x")])),
        ("(TOP (TOP (S (NN x))))", Tree("S", [Tree("NN", [], "x")])),
    ],
)
def test_clean_tree_exactly(raw: str, expected: Tree) -> None:
    assert clean_tree(parse_tree(raw)) == expected


# ------------------------------------------------------------------------- linearization
def test_linearize_vinyals_style() -> None:
    tree = parse_tree("(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))")
    assert " ".join(linearize(tree)) == "(S (NP XX XX )NP (VP XX (NP XX )NP )VP XX )S"
    assert linearize(tree, placeholder="W")[2] == "W"
    assert is_well_formed(linearize(tree), 5)
    assert not is_well_formed(linearize(tree), 4)


def test_linearize_spelling_the_words() -> None:
    tree = parse_tree("(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))")
    tokens = linearize(tree, spell={"Ms.", "plays", "."})
    assert " ".join(tokens) == "(S (NP Ms. XX )NP (VP plays (NP XX )NP )VP . )S"
    assert as_placeholders(tokens) == linearize(tree)


@needs_ptb
def test_round_trip_every_sample_tree(sample_trees: list[Tree]) -> None:
    for raw in sample_trees:
        tree = clean_tree(raw)
        assert tree is not None
        tokens = linearize(tree)
        words = tree.leaves()
        assert is_well_formed(tokens, len(words))
        # With the gold tags back in place the rebuilt tree is the cleaned tree exactly.
        assert rebuild(tokens, words, tree.tags()) == tree
        assert as_placeholders(linearize(tree, spell=set(words))) == tokens
        # Without them, the same tree with XX tags.
        plain = rebuild(tokens, words)
        assert plain.tags() == [PLACEHOLDER] * len(words)
        assert linearize(plain) == tokens and plain.leaves() == words


def test_as_placeholders_keeps_brackets_only() -> None:
    tokens = ["(S", "Xylophone", "(", ")", "ab", "XX", ")S", "(NP", "X", ")"]
    assert as_placeholders(tokens) == ["(S", "XX", "XX", "XX", "XX", "XX", ")S", "(NP", "XX", "XX"]
    assert as_placeholders(["(S", "a", ")S"], placeholder="W") == ["(S", "W", ")S"]


@pytest.mark.parametrize(
    ("tokens", "n_words", "expected"),
    [
        ("(S XX XX )S", 2, True),
        ("(S (NP XX )NP XX )", 2, True),  # a bare closer closes any label
        ("(S XX XX )S", 3, False),
        ("XX (S XX )S", 2, False),  # a word outside every bracket
        ("(S ( XX ) )S", 1, False),  # a bracket without a label
        ("(S XX )S (S XX )S", 2, False),  # two roots
        ("(S (NP )NP XX )S", 1, False),  # a constituent with no word
        ("(S XX )S )S", 1, False),  # a closer with nothing open
        ("(S XX )NP", 1, False),  # a closer for another label
        ("(S <unk> XX )S", 1, False),  # a token that is none of the above
        ("(S XX", 1, False),  # left open
        ("", 0, False),  # no tree
    ],
)
def test_is_well_formed_cases(tokens: str, n_words: int, expected: bool) -> None:
    assert is_well_formed(tokens.split(), n_words) is expected


def test_is_well_formed_custom_placeholder() -> None:
    assert is_well_formed(["(S", "W", ")S"], 1, placeholder="W")
    assert not is_well_formed(["(S", "XX", ")S"], 1, placeholder="W")


# ------------------------------------------------------------------------------ baselines
def test_baseline_trees() -> None:
    words = "The cat sat down".split()
    assert tree_to_string(flat_tree(words)) == "(S (XX The) (XX cat) (XX sat) (XX down))"
    assert tree_to_string(right_branching_tree(words)) == "(S (XX The) (NP (XX cat) (NP (XX sat) (XX down))))"
    assert tree_to_string(right_branching_tree(["Hi"])) == "(S (XX Hi))"
    long = [str(i) for i in range(5000)]  # iterative: no recursion limit
    assert right_branching_tree(long).leaves() == long


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        (lambda: flat_tree(["a", "b"], label="FRAG", tag="T"), "(FRAG (T a) (T b))"),
        (lambda: right_branching_tree(["a", "b", "c"], root="R", label="L", tag="T"), "(R (T a) (L (T b) (T c)))"),
        (lambda: right_branching_tree(["a", "b"]), "(S (XX a) (XX b))"),
        (lambda: right_branching_tree(["a"], root="R", tag="T"), "(R (T a))"),
    ],
)
def test_baseline_labels_and_tags(tree: Callable[[], Tree], expected: str) -> None:
    assert tree_to_string(tree()) == expected
    assert tree() == parse_tree(expected)  # preterminals with no children, as the reader makes them


@pytest.mark.parametrize("build", [flat_tree, right_branching_tree])
def test_baselines_reject_empty_sentences_exactly(build: Callable[[list[str]], Tree]) -> None:
    with pytest.raises(DataError) as e:
        build([])
    assert str(e.value) == "cannot build a parse tree over an empty sentence"


# ----------------------------------------------------------------------------- rebuilding
WORDS = ["the", "cat", "sat", "."]


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        # well formed
        ("(S (NP XX XX )NP (VP XX )VP XX )S", "(S (NP (XX the) (XX cat)) (VP (XX sat)) (XX .))"),
        # closer labels are not checked: a closer closes the innermost bracket
        ("(S (NP XX XX )VP (VP XX )NP XX )S", "(S (NP (XX the) (XX cat)) (VP (XX sat)) (XX .))"),
        # unmatched closers dropped
        (")S )NP (S (NP XX XX )NP (VP XX )VP XX )S )S", "(S (NP (XX the) (XX cat)) (VP (XX sat)) (XX .))"),
        # open brackets closed at the end
        ("(S (NP XX XX )NP (VP XX XX", "(S (NP (XX the) (XX cat)) (VP (XX sat) (XX .)))"),
        # extra placeholders dropped
        ("(S (NP XX XX XX )NP (VP XX XX )VP XX )S", "(S (NP (XX the) (XX cat) (XX sat)) (VP (XX .)))"),
        # missing words appended to the root
        ("(S (NP XX )NP (VP XX )VP )S", "(S (NP (XX the)) (VP (XX cat)) (XX sat) (XX .))"),
        # constituents with no words removed
        ("(S (NP XX XX )NP (ADJP )ADJP (VP (PP )PP XX )VP XX )S", "(S (NP (XX the) (XX cat)) (VP (XX sat)) (XX .))"),
        # a bracket without a label pairs with its closer, then is dissolved
        ("(S ( XX XX ) (VP XX )VP XX )S", "(S (XX the) (XX cat) (VP (XX sat)) (XX .))"),
        # tokens that mean nothing dropped
        ("(S <unk> (NP XX NP XX )NP </s> (VP XX )VP XX )S", "(S (NP (XX the) (XX cat)) (VP (XX sat)) (XX .))"),
        # several top-level pieces: wrapped in TOP
        ("(NP XX XX )NP (VP XX )VP XX", "(TOP (NP (XX the) (XX cat)) (VP (XX sat)) (XX .))"),
        # nothing usable: every word under TOP
        ("", "(TOP (XX the) (XX cat) (XX sat) (XX .))"),
        (")S )S", "(TOP (XX the) (XX cat) (XX sat) (XX .))"),
    ],
)
def test_rebuild_repairs(tokens: str, expected: str) -> None:
    tree = rebuild(tokens.split(), WORDS)
    assert tree_to_string(tree) == expected
    check_valid(tree, WORDS)


def test_rebuild_unknown_labels_dissolved_when_labels_given() -> None:
    tokens = "(S (NP XX XX )NP (FOO XX )FOO XX )S".split()
    assert tree_to_string(rebuild(tokens, WORDS)) == "(S (NP (XX the) (XX cat)) (FOO (XX sat)) (XX .))"
    tree = rebuild(tokens, WORDS, labels={"S", "NP", "VP"})
    assert tree_to_string(tree) == "(S (NP (XX the) (XX cat)) (XX sat) (XX .))"


def test_rebuild_uses_the_tags_given() -> None:
    tree = rebuild("(S (NP XX XX )NP (VP XX )VP XX )S".split(), WORDS, ["DT", "NN", "VBD", "."])
    assert tree_to_string(tree) == "(S (NP (DT the) (NN cat)) (VP (VBD sat)) (. .))"


def test_rebuild_random_token_soups_always_valid() -> None:
    rng = random.Random(1234)
    vocab = ["(S", "(NP", "(VP", "(PP", "(", ")S", ")NP", ")", ")VP", "XX", "XX", "XX", "<unk>", "NP", "(FOO"]
    vocab += ["((", "(NP)", "))", ")(", "(XX", ")XX"]
    for _ in range(3000):
        words = [f"w{i}" for i in range(rng.randint(1, 25))]
        tokens = [rng.choice(vocab) for _ in range(rng.randint(0, 80))]
        labels = {"S", "NP", "VP"} if rng.random() < 0.5 else None
        tree = rebuild(tokens, words, labels=labels)
        check_valid(tree, words)
        # deterministic, and its text form reads back as the same tree
        assert rebuild(tokens, words, labels=labels) == tree
        assert parse_tree(tree_to_string(tree)) == tree


def test_rebuild_deep_nesting_does_not_recurse() -> None:
    words = ["a", "b"]
    tokens = ["(NP"] * 3000 + ["XX"] + [")NP"] * 2000
    tree = rebuild(tokens, words)
    check_valid(tree, words)
    assert len(linearize(tree)) == 3000 * 2 + 2
    assert tree_to_string(tree).count("(NP") == 3000


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        # NX, WHNP: labels holding letters of the placeholder are still labels
        ("(NX XX XX )NX", Tree("NX", xx("a", "b"))),
        ("(S (WHNP XX )WHNP XX )S", Tree("S", [Tree("WHNP", xx("a")), *xx("b")])),
        # a label holding a space or a bracket is not one: dissolved
        ("(S (N\tP XX )NP XX )S", Tree("S", xx("a", "b"))),
        ("(S (N(P XX ) XX )S", Tree("S", xx("a", "b"))),
        # a word the output did not place is appended to the root, as a preterminal
        ("(S XX )S", Tree("S", xx("a", "b"))),
    ],
)
def test_rebuild_trees_exactly(tokens: str, expected: Tree) -> None:
    assert rebuild(tokens.split(" "), ["a", "b"]) == expected


def test_rebuild_empty_sentence_message() -> None:
    with pytest.raises(DataError) as e:
        rebuild(["(S", "XX", ")S"], [])
    assert str(e.value) == "cannot build a parse tree over an empty sentence"
    with pytest.raises(DataError) as e:
        rebuild(["(S", "XX", ")S"], ["a"], ["DT", "NN"])
    assert str(e.value) == "2 POS tags for 1 words"


@pytest.mark.parametrize(
    ("tokens", "placeholder", "logged"),
    [
        ("(S XX XX )S", "XX", []),
        ("(S W W )S", "W", []),
        ("(S XX", "XX", ["repaired malformed prediction: (S XX"]),
        ("(S XX XX XX )S", "XX", ["repaired malformed prediction: (S XX XX XX )S"]),
    ],
)
def test_rebuild_logs_repairs_at_debug(caplog: pytest.LogCaptureFixture, tokens: str, placeholder: str,
                                       logged: list[str]) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        tree = rebuild(tokens.split(), ["a", "b"], placeholder=placeholder)
    assert tree_to_string(tree) == f"(S ({placeholder} a) ({placeholder} b))"
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == logged


# ------------------------------------------------------------- read_trees names its file
def test_read_trees_names_the_file_in_a_syntax_error(tmp_path: Path) -> None:
    unbalanced = tmp_path / "open.mrg"
    unbalanced.write_text("(S (NN a))\n(S (NN b)\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        read_trees(unbalanced)
    assert str(e.value) == f"{unbalanced}:2: unbalanced brackets (tree never closed)"
    with pytest.raises(DataError) as e:
        read_trees(str(unbalanced))
    assert str(e.value) == f"{unbalanced}:2: unbalanced brackets (tree never closed)"
