"""Tests for aiayn.data.trees: reading, cleaning, linearizing, rebuilding, preparing."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from aiayn.data.trees import (
    PLACEHOLDER,
    Tree,
    as_placeholders,
    clean_tree,
    flat_tree,
    is_well_formed,
    linearize,
    parse_tree,
    phrase_subtrees,
    prepare_parsing,
    read_trees,
    read_trees_with_lines,
    rebuild,
    right_branching_tree,
    spelled_words,
    strip_label,
    substituted,
    tree_to_string,
)
from aiayn.errors import DataError

MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR", Path(__file__).resolve().parents[3] / "shared" / "data"))
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


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("(S (NP (DT the)\n(NN cat)", 1, "unbalanced"),
        ("(S (NP (DT the)))\n)", 2, "closing bracket"),
        ("(S (NP (DT the)))\nstray", 2, "outside brackets"),
        ("(S\n(NP (DT the) word))", 2, "mixes"),
        ("(S (DT the extra))", 1, "more than one word"),
        ("(S ())", 1, "empty brackets"),
    ],
)
def test_reader_errors_name_file_and_line(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = tmp_path / "bad.mrg"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=rf"bad\.mrg:{line}: .*{message}"):
        read_trees(path)


def test_reader_missing_file_and_bad_utf8(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_trees(tmp_path / "nope.mrg")
    bad = tmp_path / "latin1.mrg"
    bad.write_bytes(b"(S (NN caf\xe9))")
    with pytest.raises(DataError, match="UTF-8"):
        read_trees(bad)


@needs_ptb
def test_reader_on_sample(sample_trees: list[Tree]) -> None:
    assert len(read_trees(PTB_FILES / "wsj_0001.mrg")) == 2
    assert len(sample_trees) == 3914


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
    assert spelled_words([tree, parse_tree("(S (NP (NN plays)) (. .))")], min_count=2) == {"plays", "."}


def test_baseline_trees() -> None:
    words = "The cat sat down".split()
    assert tree_to_string(flat_tree(words)) == "(S (XX The) (XX cat) (XX sat) (XX down))"
    assert tree_to_string(right_branching_tree(words)) == "(S (XX The) (NP (XX cat) (NP (XX sat) (XX down))))"
    assert tree_to_string(right_branching_tree(["Hi"])) == "(S (XX Hi))"
    long = [str(i) for i in range(5000)]  # iterative: no recursion limit
    assert right_branching_tree(long).leaves() == long
    with pytest.raises(DataError, match="empty sentence"):
        right_branching_tree([])


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


def test_rebuild_uses_tags_and_rejects_bad_input() -> None:
    tree = rebuild("(S (NP XX XX )NP (VP XX )VP XX )S".split(), WORDS, ["DT", "NN", "VBD", "."])
    assert tree_to_string(tree) == "(S (NP (DT the) (NN cat)) (VP (VBD sat)) (. .))"
    with pytest.raises(DataError, match="empty sentence"):
        rebuild(["(S", "XX", ")S"], [])
    with pytest.raises(DataError, match="POS tags"):
        rebuild(["(S", "XX", ")S"], ["a"], ["DT", "NN"])


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


def test_phrase_subtrees_are_every_phrase_below_the_root_of_enough_words() -> None:
    tree = parse_tree("(S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))")
    phrases = phrase_subtrees([tree, parse_tree("(S (NP (PRP It)) (VP (VBZ rains)))")], 2)
    assert [(" ".join(p.leaves()), " ".join(linearize(p))) for p in phrases] == [
        ("The cat", "(NP XX XX )NP"),
        ("sat on the mat", "(VP XX (PP XX (NP XX XX )NP )PP )VP"),
        ("on the mat", "(PP XX (NP XX XX )NP )PP"),
        ("the mat", "(NP XX XX )NP"),
    ]
    assert [" ".join(p.leaves()) for p in phrase_subtrees([tree], 3)] == ["sat on the mat", "on the mat"]


def test_substituted_variants_keep_the_brackets_and_draw_words_of_the_same_tag() -> None:
    trees = [parse_tree("(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"),
             parse_tree("(S (NP (DT a) (NN dog)) (VP (VBD ran) (ADVP (RB away))) (. !))")]
    before = [tree_to_string(t) for t in trees]
    variants = substituted(trees, 3, 1.0, trees, seed=7)
    assert [tree_to_string(t) for t in trees] == before  # the originals are not touched
    assert len(variants) == 6
    pool = {"DT": {"The", "a"}, "NN": {"cat", "dog"}, "VBD": {"sat", "ran"}, "RB": {"away"}, ".": {".", "!"}}
    for i, variant in enumerate(variants):
        original = trees[i % 2]  # each copy is a pass over the trees in order
        assert as_placeholders(linearize(variant)) == as_placeholders(linearize(original))
        assert variant.tags() == original.tags()
        assert all(word in pool[tag] for word, tag in zip(variant.leaves(), variant.tags()))
    # rate 1 replaces every word: the draws reach other words than the originals
    assert {" ".join(v.leaves()) for v in variants} - {" ".join(t.leaves()) for t in trees}
    # deterministic in the seed; another seed draws otherwise
    assert [tree_to_string(t) for t in substituted(trees, 3, 1.0, trees, seed=7)] == [
        tree_to_string(t) for t in variants]
    assert [tree_to_string(t) for t in substituted(trees, 3, 1.0, trees, seed=8)] != [
        tree_to_string(t) for t in variants]


def test_substitution_rate_is_the_share_of_words_redrawn() -> None:
    # 20 tags, each with 20 distinct words: a redrawn word is a new one 95% of the time.
    lexicon = [parse_tree("(S " + " ".join(f"(T{t} w{t}_{k})" for t in range(20)) + ")") for k in range(20)]
    changed = total = 0
    for original, variant in zip(lexicon * 5, substituted(lexicon, 5, 0.3, lexicon, seed=1)):
        changed += sum(a != b for a, b in zip(original.leaves(), variant.leaves()))
        total += len(original.leaves())
    assert 0.3 * 0.95 - 0.04 < changed / total < 0.3 * 0.95 + 0.04
    # a word whose tag the lexicon lacks stays
    assert substituted([parse_tree("(S (ZZ odd))")], 1, 1.0, lexicon)[0].leaves() == ["odd"]


# ---------------------------------------------------------------------------- preparation
def _three_files(tmp_path: Path) -> tuple[Path, dict[str, tuple[int, int]]]:
    """A treebank of wsj_0001-0003 and a split of it: train 1-2, test 3."""
    ptb = tmp_path / "ptb"
    ptb.mkdir()
    for name in ("wsj_0001.mrg", "wsj_0002.mrg", "wsj_0003.mrg"):
        shutil.copy(PTB_FILES / name, ptb / name)
    return ptb, {"train": (1, 2), "test": (3, 3)}


@needs_ptb
def test_prepare_parsing_with_phrases_adds_training_pairs_only(tmp_path: Path) -> None:
    ptb, splits = _three_files(tmp_path)
    plain, more = tmp_path / "plain", tmp_path / "more"
    assert "phrases" not in prepare_parsing(ptb, plain, splits=splits, target="words")
    summary = prepare_parsing(ptb, more, splits=splits, target="words", subtrees=3)
    train_trees = read_trees(plain / "train.gold.txt")
    phrases = phrase_subtrees(train_trees, 3)
    assert summary["phrases"] == len(phrases) == 24
    # The phrases add pairs, not trees: the counts are the whole sentences'.
    assert summary["splits"]["train"] == {"trees": 3, "words": 57, "skipped": 0, "files": "wsj_0001-wsj_0002"}
    for kind in ("src", "tgt"):
        whole = (plain / f"train.{kind}.txt").read_text(encoding="utf-8")
        lines = (more / f"train.{kind}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        assert "".join(lines[:3]) == whole and len(lines) == 3 + len(phrases)
    src = (more / "train.src.txt").read_text(encoding="utf-8").splitlines()
    tgt = (more / "train.tgt.txt").read_text(encoding="utf-8").splitlines()
    assert src[3:5] == ["Pierre Vinken , 61 years old ,", "61 years old"]
    assert tgt[3:5] == ["(NP (NP XX Vinken )NP , (ADJP (NP XX years )NP old )ADJP , )NP",
                        "(ADJP (NP XX years )NP old )ADJP"]
    for name in ("train.gold.txt", "test.src.txt", "test.tgt.txt", "test.gold.txt"):
        assert (more / name).read_bytes() == (plain / name).read_bytes()


@needs_ptb
def test_prepare_parsing_with_substitutions_appends_variants_of_trees_and_phrases(tmp_path: Path) -> None:
    ptb, splits = _three_files(tmp_path)
    base, more = tmp_path / "base", tmp_path / "more"
    prepare_parsing(ptb, base, splits=splits, target="words", subtrees=3)
    summary = prepare_parsing(ptb, more, splits=splits, target="words", subtrees=3, substitutions=2,
                              substitution_rate=0.5, seed=3)
    assert (summary["phrases"], summary["substituted"]) == (24, 2 * (3 + 24))
    trees = read_trees(base / "train.gold.txt")
    expected = substituted(trees + phrase_subtrees(trees, 3), 2, 0.5, trees, seed=3)
    spell = spelled_words(trees, 2)
    first, lines = {}, {}
    for kind in ("src", "tgt"):
        first[kind] = (base / f"train.{kind}.txt").read_text(encoding="utf-8").splitlines()
        lines[kind] = (more / f"train.{kind}.txt").read_text(encoding="utf-8").splitlines()
        assert lines[kind][:27] == first[kind] and len(lines[kind]) == 27 + 54
    assert lines["src"][27:] == [" ".join(t.leaves()) for t in expected]
    assert lines["tgt"][27:] == [" ".join(linearize(t, spell=spell)) for t in expected]
    assert lines["src"][27:] != first["src"] * 2
    for name in ("train.gold.txt", "test.src.txt", "test.tgt.txt", "test.gold.txt"):
        assert (more / name).read_bytes() == (base / name).read_bytes()


@needs_ptb
def test_prepare_parsing_spelling_the_words(tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = prepare_parsing(PTB_DIR, out, target="words", min_count=2)
    assert summary["target"] == "words" and summary["spelled_words"] == 5280
    train = (out / "train.tgt.txt").read_text(encoding="utf-8").splitlines()
    assert train[1] == ("(S (NP Mr. Vinken )NP (VP is (NP (NP chairman )NP (PP of (NP (NP XX N.V. )NP , "
                        "(NP the Dutch publishing group )NP )NP )PP )NP )VP . )S")
    # "Elsevier" is seen once in training: XX. No target spells a word that training does not.
    spelled = {w for line in train for w in line.split() if w[0] not in "()"}
    test = {w for w in (out / "test.tgt.txt").read_text(encoding="utf-8").split() if w[0] not in "()"}
    assert len(spelled) == 5280 + 1 and "XX" in test and test <= spelled
    with pytest.raises(DataError, match="parsing target must be one of"):
        prepare_parsing(PTB_DIR, tmp_path / "o2", target="letters")


@needs_ptb
def test_prepare_parsing_on_sample(tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = prepare_parsing(PTB_DIR, out)  # finds combined/ by itself
    splits = summary["splits"]
    assert {role: s["trees"] for role, s in splits.items()} == {"train": 3396, "valid": 273, "test": 245}
    assert splits["train"]["files"] == "wsj_0001-wsj_0159"
    assert splits["valid"]["files"] == "wsj_0160-wsj_0179"
    assert splits["test"]["files"] == "wsj_0180-wsj_0199"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{role}.{kind}.txt" for role in ("train", "valid", "test") for kind in ("src", "tgt", "gold")
    )
    for role in ("valid", "test"):
        src = (out / f"{role}.src.txt").read_text(encoding="utf-8").splitlines()
        tgt = (out / f"{role}.tgt.txt").read_text(encoding="utf-8").splitlines()
        gold = (out / f"{role}.gold.txt").read_text(encoding="utf-8").splitlines()
        assert len(src) == len(tgt) == len(gold) == splits[role]["trees"]
        for s, t, g in zip(src, tgt, gold):
            words = s.split(" ")
            gold_tree = parse_tree(g)
            assert gold_tree.leaves() == words
            assert rebuild(t.split(" "), words, gold_tree.tags()) == gold_tree


@needs_ptb
def test_prepare_parsing_custom_splits_and_errors(tmp_path: Path) -> None:
    src = tmp_path / "ptb"
    src.mkdir()
    for name in ("wsj_0001.mrg", "wsj_0002.mrg"):
        shutil.copy(PTB_FILES / name, src / name)
    out = tmp_path / "out"
    summary = prepare_parsing(src, out, splits={"train": (1, 1), "test": (2, 2)})
    assert summary["splits"]["train"] == {"trees": 2, "words": 31, "skipped": 0, "files": "wsj_0001-wsj_0001"}
    assert (out / "train.src.txt").read_text(encoding="utf-8").splitlines()[1] == (
        "Mr. Vinken is chairman of Elsevier N.V. , the Dutch publishing group ."
    )
    assert not list(out.glob(".*"))  # no temporaries left behind

    with pytest.raises(DataError, match="missing 1 treebank file"):
        prepare_parsing(src, tmp_path / "out2", splits={"train": (1, 3)})
    assert not (tmp_path / "out2").exists()  # nothing written when it fails
    with pytest.raises(DataError, match="not found"):
        prepare_parsing(tmp_path / "nowhere", out)
