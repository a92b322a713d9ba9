"""Exact messages, tokens and trees of aiayn.data.trees on small hand-made cases.

Each case pins one rule of the module docstring to the value it produces; the broader
behaviour (round trips over the treebank sample, random repairs) is in test_trees.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import aiayn
from aiayn.data.trees import (
    Tree,
    as_placeholders,
    clean_tree,
    flat_tree,
    is_well_formed,
    iter_trees,
    parse_tree,
    prepare_parsing,
    read_trees,
    read_trees_with_lines,
    rebuild,
    right_branching_tree,
    strip_label,
    tree_to_string,
)
from aiayn.errors import DataError

LOGGER = "aiayn.data.trees"


def xx(*words: str) -> list[Tree]:
    """Preterminals tagged XX, as :func:`rebuild` makes them without tags."""
    return [Tree("XX", [], w) for w in words]


# ------------------------------------------------------------------------------- reading
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
        ("-X|Y", "-X|Y"),  # a label starting with "-" is whole, "|" included
        ("ADVP|PRT|NP", "ADVP"),  # the first of several alternatives
        ("=X", "=X"),  # nothing before the tag: kept as it is
        ("NP-SBJ=2-1", "NP"),
    ],
)
def test_strip_label_edges(label: str, expected: str) -> None:
    assert strip_label(label) == expected


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


# ---------------------------------------------------------------------------- preparation
TINY_TREEBANK = {
    "wsj_0001.mrg": "( (S (NP-SBJ (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .)) )\n"
                    "( (S (-NONE- *)) )\n( (-NONE- *) )\n",
    "wsj_0002.mrg": "( (NP (DT The) (NN cat)) )\n( (S (NP (NNP Haag)) (VP (VBZ plays))) )\n",
}


@pytest.fixture
def tiny_ptb(tmp_path: Path) -> Path:
    """Two treebank files under ``combined/``, as the NLTK sample lays them out."""
    combined = tmp_path / "ptb" / "combined"
    combined.mkdir(parents=True)
    for name, text in TINY_TREEBANK.items():
        (combined / name).write_text(text, encoding="utf-8")
    return tmp_path / "ptb"


def test_prepare_parsing_tiny_treebank_exactly(tiny_ptb: Path, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger=LOGGER):
        summary = prepare_parsing(tiny_ptb, out, splits={"train": (1, 1), "test": (2, 2)}, placeholder="W",
                                  target="words", min_count=1, subtrees=2)
    assert summary == {
        "splits": {
            "train": {"trees": 1, "words": 5, "skipped": 2, "files": "wsj_0001-wsj_0001"},
            "test": {"trees": 2, "words": 4, "skipped": 0, "files": "wsj_0002-wsj_0002"},
        },
        "placeholder": "W",
        "target": "words",
        "source": str(tiny_ptb / "combined"),
        "spelled_words": 5,
        "phrases": 2,
    }
    assert {f.name: f.read_text(encoding="utf-8") for f in out.iterdir()} == {
        "train.src.txt": "Ms. Haag plays Elianti .\nMs. Haag\nplays Elianti\n",
        "train.tgt.txt": "(S (NP Ms. Haag )NP (VP plays (NP Elianti )NP )VP . )S\n(NP Ms. Haag )NP\n"
                         "(VP plays (NP Elianti )NP )VP\n",
        "train.gold.txt": "(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))\n",
        # "The" and "cat" are not in the training trees: placeholders
        "test.src.txt": "The cat\nHaag plays\n",
        "test.tgt.txt": "(NP W W )NP\n(S (NP Haag )NP (VP plays )VP )S\n",
        "test.gold.txt": "(NP (DT The) (NN cat))\n(S (NP (NNP Haag)) (VP (VBZ plays)))\n",
    }
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER] == [
        *[("WARNING", f"{tiny_ptb / 'combined' / 'wsj_0001.mrg'}:{line}: tree has no words after removing "
                      "empty elements; skipped") for line in (2, 3)],
        ("INFO", "parsing train: 1 trees from wsj_0001-wsj_0001"),
        ("INFO", "parsing test: 2 trees from wsj_0002-wsj_0002"),
    ]


def test_prepare_parsing_placeholder_target_and_min_count(tiny_ptb: Path, tmp_path: Path) -> None:
    splits = {"train": (1, 2)}
    summary = prepare_parsing(tiny_ptb, tmp_path / "a", splits=splits)
    assert (summary["target"], summary["placeholder"], summary["spelled_words"]) == ("placeholders", "XX", 0)
    assert "phrases" not in summary
    assert (tmp_path / "a" / "train.tgt.txt").read_text(encoding="utf-8").splitlines() == [
        "(S (NP XX XX )NP (VP XX (NP XX )NP )VP XX )S", "(NP XX XX )NP", "(S (NP XX )NP (VP XX )VP )S"]
    # min_count 2 (the default): only "Haag" and "plays" are seen twice
    summary = prepare_parsing(tiny_ptb, tmp_path / "b", splits=splits, target="words")
    assert summary["spelled_words"] == 2
    assert (tmp_path / "b" / "train.tgt.txt").read_text(encoding="utf-8").splitlines() == [
        "(S (NP XX Haag )NP (VP plays (NP XX )NP )VP XX )S", "(NP XX XX )NP", "(S (NP Haag )NP (VP plays )VP )S"]
    # without a train role nothing is spelled
    summary = prepare_parsing(tiny_ptb, tmp_path / "c", splits={"test": (1, 2)}, target="words", subtrees=1)
    assert summary["spelled_words"] == 0 and "phrases" not in summary


def test_prepare_parsing_errors_exactly(tiny_ptb: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        prepare_parsing(tiny_ptb, tmp_path / "o", splits={"train": (1, 9)})
    assert str(e.value) == (f"{tiny_ptb / 'combined'}: missing 7 treebank file(s): "
                            "wsj_0003.mrg, wsj_0004.mrg, wsj_0005.mrg, wsj_0006.mrg, wsj_0007.mrg")
    with pytest.raises(DataError) as e:
        prepare_parsing(tmp_path / "nowhere", tmp_path / "o")
    assert str(e.value) == f"{tmp_path / 'nowhere'}: treebank directory not found"
    with pytest.raises(DataError) as e:
        prepare_parsing(tiny_ptb, tmp_path / "o", target="letters")
    assert str(e.value) == "parsing target must be one of placeholders, words, got 'letters'"
    assert not (tmp_path / "o").exists()


def test_prepare_parsing_phrases_of_one_word_and_up(tiny_ptb: Path, tmp_path: Path) -> None:
    out = tmp_path / "deeper" / "out"  # parents are made
    summary = prepare_parsing(tiny_ptb, out, splits={"train": (1, 1)}, subtrees=1)
    assert summary["phrases"] == 3
    assert (out / "train.src.txt").read_text(encoding="utf-8") == (
        "Ms. Haag plays Elianti .\nMs. Haag\nplays Elianti\nElianti\n")
    # an existing output directory is written into
    assert prepare_parsing(tiny_ptb, out, splits={"train": (2, 2)})["splits"]["train"]["trees"] == 2
    assert (out / "train.src.txt").read_text(encoding="utf-8") == "The cat\nHaag plays\n"


def test_prepare_parsing_prefers_top_level_files_to_combined(tiny_ptb: Path, tmp_path: Path) -> None:
    (tiny_ptb / "wsj_0001.mrg").write_text("(S (NN top))\n", encoding="utf-8")
    summary = prepare_parsing(tiny_ptb, tmp_path / "out", splits={"train": (1, 1)})
    assert summary["source"] == str(tiny_ptb)
    assert (tmp_path / "out" / "train.src.txt").read_text(encoding="utf-8") == "top\n"


def test_prepare_parsing_default_splits(tiny_ptb: Path, tmp_path: Path) -> None:
    # train is wsj_0001-wsj_0159: all but the two files here are missing
    with pytest.raises(DataError) as e:
        prepare_parsing(tiny_ptb, tmp_path / "out")
    assert str(e.value) == (f"{tiny_ptb / 'combined'}: missing 157 treebank file(s): "
                            "wsj_0003.mrg, wsj_0004.mrg, wsj_0005.mrg, wsj_0006.mrg, wsj_0007.mrg")
