"""The Penn Treebank as parsing data (aiayn.data.treebank): the project's split written as
parallel text and gold trees, extra training pairs (phrases, same-tag substitution), and the
prepared-data directory that `aiayn prepare --task parsing` builds from it."""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from aiayn.cli.main import main
from aiayn.config import DataConfig
from aiayn.data import datasets as ds
from aiayn.data import treebank
from aiayn.data.prepare import read_summary, split_text
from aiayn.data.treebank import (
    phrase_subtrees,
    prepare_parsing_data,
    spelled_words,
    substituted,
    write_parsing_text,
)
from aiayn.data.trees import as_placeholders, linearize, parse_tree, read_trees, rebuild, tree_to_string
from aiayn.errors import AiaynError, DataError

LOGGER = "aiayn.data.treebank"
# The offline data mirror (real corpora): $AIAYN_DATA_MIRROR alone, which .ci/run sets. Unset, a
# path that exists nowhere and names the variable, so the tests that need data skip saying so.
MIRROR = Path(os.environ.get("AIAYN_DATA_MIRROR") or "/AIAYN_DATA_MIRROR-is-not-set")
PTB_DIR = MIRROR / "ptb-sample"
PTB_FILES = PTB_DIR / "combined"

needs_ptb = pytest.mark.skipif(not PTB_FILES.is_dir(), reason=f"the data mirror has no {PTB_FILES}")


def cli(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------------------- augmentation
def test_spelled_words_are_those_seen_min_count_times() -> None:
    tree = parse_tree("(S (NP (NNP Ms.) (NNP Haag)) (VP (VBZ plays) (NP (NNP Elianti))) (. .))")
    assert spelled_words([tree, parse_tree("(S (NP (NN plays)) (. .))")], min_count=2) == {"plays", "."}


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


# ------------------------------------------------------------- parallel text, exactly
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


def test_write_parsing_text_tiny_treebank_exactly(tiny_ptb: Path, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO, logger=LOGGER):
        summary = write_parsing_text(tiny_ptb, out, splits={"train": (1, 1), "test": (2, 2)}, placeholder="W",
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


def test_write_parsing_text_placeholder_target_and_min_count(tiny_ptb: Path, tmp_path: Path) -> None:
    splits = {"train": (1, 2)}
    summary = write_parsing_text(tiny_ptb, tmp_path / "a", splits=splits)
    assert (summary["target"], summary["placeholder"], summary["spelled_words"]) == ("placeholders", "XX", 0)
    assert "phrases" not in summary
    assert (tmp_path / "a" / "train.tgt.txt").read_text(encoding="utf-8").splitlines() == [
        "(S (NP XX XX )NP (VP XX (NP XX )NP )VP XX )S", "(NP XX XX )NP", "(S (NP XX )NP (VP XX )VP )S"]
    # min_count 2 (the default): only "Haag" and "plays" are seen twice
    summary = write_parsing_text(tiny_ptb, tmp_path / "b", splits=splits, target="words")
    assert summary["spelled_words"] == 2
    assert (tmp_path / "b" / "train.tgt.txt").read_text(encoding="utf-8").splitlines() == [
        "(S (NP XX Haag )NP (VP plays (NP XX )NP )VP XX )S", "(NP XX XX )NP", "(S (NP Haag )NP (VP plays )VP )S"]
    # without a train role nothing is spelled
    summary = write_parsing_text(tiny_ptb, tmp_path / "c", splits={"test": (1, 2)}, target="words", subtrees=1)
    assert summary["spelled_words"] == 0 and "phrases" not in summary


def test_write_parsing_text_errors_exactly(tiny_ptb: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError) as e:
        write_parsing_text(tiny_ptb, tmp_path / "o", splits={"train": (1, 9)})
    assert str(e.value) == (f"{tiny_ptb / 'combined'}: missing 7 treebank file(s): "
                            "wsj_0003.mrg, wsj_0004.mrg, wsj_0005.mrg, wsj_0006.mrg, wsj_0007.mrg")
    with pytest.raises(DataError) as e:
        write_parsing_text(tmp_path / "nowhere", tmp_path / "o")
    assert str(e.value) == f"{tmp_path / 'nowhere'}: treebank directory not found"
    with pytest.raises(DataError) as e:
        write_parsing_text(tiny_ptb, tmp_path / "o", target="letters")
    assert str(e.value) == "parsing target must be one of placeholders, words, got 'letters'"
    assert not (tmp_path / "o").exists()


def test_write_parsing_text_phrases_of_one_word_and_up(tiny_ptb: Path, tmp_path: Path) -> None:
    out = tmp_path / "deeper" / "out"  # parents are made
    summary = write_parsing_text(tiny_ptb, out, splits={"train": (1, 1)}, subtrees=1)
    assert summary["phrases"] == 3
    assert (out / "train.src.txt").read_text(encoding="utf-8") == (
        "Ms. Haag plays Elianti .\nMs. Haag\nplays Elianti\nElianti\n")
    # an existing output directory is written into
    assert write_parsing_text(tiny_ptb, out, splits={"train": (2, 2)})["splits"]["train"]["trees"] == 2
    assert (out / "train.src.txt").read_text(encoding="utf-8") == "The cat\nHaag plays\n"


def test_write_parsing_text_prefers_top_level_files_to_combined(tiny_ptb: Path, tmp_path: Path) -> None:
    (tiny_ptb / "wsj_0001.mrg").write_text("(S (NN top))\n", encoding="utf-8")
    summary = write_parsing_text(tiny_ptb, tmp_path / "out", splits={"train": (1, 1)})
    assert summary["source"] == str(tiny_ptb)
    assert (tmp_path / "out" / "train.src.txt").read_text(encoding="utf-8") == "top\n"


def test_write_parsing_text_default_splits(tiny_ptb: Path, tmp_path: Path) -> None:
    # train is wsj_0001-wsj_0159: all but the two files here are missing
    with pytest.raises(DataError) as e:
        write_parsing_text(tiny_ptb, tmp_path / "out")
    assert str(e.value) == (f"{tiny_ptb / 'combined'}: missing 157 treebank file(s): "
                            "wsj_0003.mrg, wsj_0004.mrg, wsj_0005.mrg, wsj_0006.mrg, wsj_0007.mrg")


# ---------------------------------------------------------- parallel text, the sample
def _three_files(tmp_path: Path) -> tuple[Path, dict[str, tuple[int, int]]]:
    """A treebank of wsj_0001-0003 and a split of it: train 1-2, test 3."""
    ptb = tmp_path / "ptb"
    ptb.mkdir()
    for name in ("wsj_0001.mrg", "wsj_0002.mrg", "wsj_0003.mrg"):
        shutil.copy(PTB_FILES / name, ptb / name)
    return ptb, {"train": (1, 2), "test": (3, 3)}


@needs_ptb
def test_write_parsing_text_with_phrases_adds_training_pairs_only(tmp_path: Path) -> None:
    ptb, splits = _three_files(tmp_path)
    plain, more = tmp_path / "plain", tmp_path / "more"
    assert "phrases" not in write_parsing_text(ptb, plain, splits=splits, target="words")
    summary = write_parsing_text(ptb, more, splits=splits, target="words", subtrees=3)
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
def test_write_parsing_text_with_substitutions_appends_variants_of_trees_and_phrases(tmp_path: Path) -> None:
    ptb, splits = _three_files(tmp_path)
    base, more = tmp_path / "base", tmp_path / "more"
    write_parsing_text(ptb, base, splits=splits, target="words", subtrees=3)
    summary = write_parsing_text(ptb, more, splits=splits, target="words", subtrees=3, substitutions=2,
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
def test_write_parsing_text_spelling_the_words(tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = write_parsing_text(PTB_DIR, out, target="words", min_count=2)
    assert summary["target"] == "words" and summary["spelled_words"] == 5280
    train = (out / "train.tgt.txt").read_text(encoding="utf-8").splitlines()
    assert train[1] == ("(S (NP Mr. Vinken )NP (VP is (NP (NP chairman )NP (PP of (NP (NP XX N.V. )NP , "
                        "(NP the Dutch publishing group )NP )NP )PP )NP )VP . )S")
    # "Elsevier" is seen once in training: XX. No target spells a word that training does not.
    spelled = {w for line in train for w in line.split() if w[0] not in "()"}
    test = {w for w in (out / "test.tgt.txt").read_text(encoding="utf-8").split() if w[0] not in "()"}
    assert len(spelled) == 5280 + 1 and "XX" in test and test <= spelled


@needs_ptb
def test_write_parsing_text_on_sample(tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = write_parsing_text(PTB_DIR, out)  # finds combined/ by itself
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
def test_write_parsing_text_custom_splits_and_errors(tmp_path: Path) -> None:
    src = tmp_path / "ptb"
    src.mkdir()
    for name in ("wsj_0001.mrg", "wsj_0002.mrg"):
        shutil.copy(PTB_FILES / name, src / name)
    out = tmp_path / "out"
    summary = write_parsing_text(src, out, splits={"train": (1, 1), "test": (2, 2)})
    assert summary["splits"]["train"] == {"trees": 2, "words": 31, "skipped": 0, "files": "wsj_0001-wsj_0001"}
    assert (out / "train.src.txt").read_text(encoding="utf-8").splitlines()[1] == (
        "Mr. Vinken is chairman of Elsevier N.V. , the Dutch publishing group ."
    )
    assert not list(out.glob(".*"))  # no temporaries left behind

    with pytest.raises(DataError, match="missing 1 treebank file"):
        write_parsing_text(src, tmp_path / "out2", splits={"train": (1, 3)})
    assert not (tmp_path / "out2").exists()  # nothing written when it fails


# ----------------------------------------------------------------- prepared directory


def _mini_treebank(directory: Path) -> Path:
    """wsj_0001..0199.mrg (the project's split) of two real-shaped treebank trees each."""
    directory.mkdir()
    trees = ["( (S (NP-SBJ (DT The) (NN dog)) (VP (VBZ barks)) (. .)) )",
             "( (S (NP-SBJ (PRP It)) (VP (VBD rained) (NP-TMP (NN yesterday) (-NONE- *T*-1))) (. .)) )"]
    for i in range(1, 200):
        (directory / f"wsj_{i:04d}.mrg").write_text("\n".join(trees) + "\n")
    return directory


@pytest.mark.parametrize("target", ["placeholders", "words"])
def test_parsing_builds_a_prepared_directory(tmp_path: Path, target: str) -> None:
    """`aiayn prepare --task parsing` over .mrg files: cleaned trees, linearized targets, gold."""
    ptb = _mini_treebank(tmp_path / "ptb")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  vocab_size: 40\n  parsing_target: " + target + "\n"
                   "  tgt_vocab_size: 64\n")
    code = cli(["prepare", "--task", "parsing", "--config", str(cfg), "--ptb-dir", str(ptb),
                "--out", str(tmp_path / "p"), "--quiet"])
    assert code == 0
    summary = read_summary(tmp_path / "p")
    assert summary["task"] == "parsing" and not summary["joint_vocab"]
    assert summary["parsing"]["target"] == target
    # Tree symbols: (S )S (NP )NP (VP )VP, and XX or the words (The dog barks . It rained yesterday).
    assert summary["tgt_vocab_size"] == 4 + 6 + (1 if target == "placeholders" else 7)
    gold = (tmp_path / "p" / "test.gold.txt").read_text().splitlines()
    assert gold[:2] == ["(S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .))",
                        "(S (NP (PRP It)) (VP (VBD rained) (NP (NN yesterday))) (. .))"]
    expected = ("(S (NP XX XX )NP (VP XX )VP XX )S" if target == "placeholders"
                else "(S (NP The dog )NP (VP barks )VP . )S")
    assert split_text(tmp_path / "p", "test")[1][0] == expected
    assert leftovers(tmp_path) == []


def test_parsing_finds_the_treebank_in_the_data_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Without --ptb-dir the treebank is ptb-sample/ in --data-dir, else in $AIAYN_DATA_MIRROR."""
    _mini_treebank(tmp_path / "ptb-sample")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  vocab_size: 40\n  tgt_vocab_size: 64\n")
    args = ["prepare", "--task", "parsing", "--config", str(cfg), "--quiet", "--out"]
    monkeypatch.delenv(ds.MIRROR_ENV, raising=False)
    assert cli([*args, str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "--task parsing needs --ptb-dir (or --data-dir or $AIAYN_DATA_MIRROR holding ptb-sample/)")
    assert cli([*args, str(tmp_path / "p1"), "--data-dir", str(tmp_path)]) == 0
    monkeypatch.setenv(ds.MIRROR_ENV, str(tmp_path))
    assert cli([*args, str(tmp_path / "p2")]) == 0
    assert split_text(tmp_path / "p1", "test") == split_text(tmp_path / "p2", "test")


# ------------------------------------------------------ substitution: seed and rate exactly
def test_substituted_seed_defaults_to_one() -> None:
    trees = [parse_tree("(S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .))"),
             parse_tree("(S (NP (DT a) (NN dog)) (VP (VBD ran) (ADVP (RB away))) (. !))")]

    def drawn(**seed: int) -> list[str]:
        return [tree_to_string(t) for t in substituted(trees, 4, 0.5, trees, **seed)]

    assert drawn() == drawn(seed=1) != drawn(seed=2)


def test_substitution_rate_is_a_strict_bound_on_the_draw() -> None:
    # A word is replaced when the draw is below the rate: a draw equal to it keeps the word.
    tree, lexicon = [parse_tree("(S (NN a))")], [parse_tree("(S (NN b))")]
    draw = random.Random(5).random()
    assert substituted(tree, 1, draw, lexicon, seed=5)[0].leaves() == ["a"]
    assert substituted(tree, 1, math.nextafter(draw, 1.0), lexicon, seed=5)[0].leaves() == ["b"]


# ------------------------------------------------------- prepared directory, exactly
PARSING_CFG = DataConfig(vocab_size=40, parsing_target="words", parsing_min_count=200, parsing_subtrees=2,
                         parsing_substitutions=1, parsing_substitution_rate=0.25, seed=3,
                         # the parsing task reads the treebank only: these are set aside
                         dataset="multi30k", synthetic="copy")
SMALL_CFG = DataConfig(vocab_size=40, tgt_vocab_size=64)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, str, Path]:
    """The summary, directory and progress output (stderr) of prepare_parsing_data over
    the mini treebank, with its defaults (progress shown, no force); and the treebank."""
    root = tmp_path_factory.mktemp("prepared")
    ptb = _mini_treebank(root / "ptb")
    out = root / "new" / "parents" / "p"  # parents are made
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        summary = prepare_parsing_data(ptb, out, PARSING_CFG)
    return summary, out, err.getvalue(), ptb


def test_prepare_parsing_data_summary_exactly(prepared: tuple[dict, Path, str, Path]) -> None:
    summary, out, progress, ptb = prepared
    assert read_summary(out) == summary
    assert summary["task"] == "parsing"
    assert summary["source"] == {"dataset": "ptb", "synthetic": None, "src_lang": "words", "tgt_lang": "trees"}
    # spelled: "." alone is seen 200 times; a phrase of 2 words and up per tree; one variant of each pair
    assert summary["parsing"] == {
        "splits": {"train": {"trees": 318, "words": 1272, "skipped": 0, "files": "wsj_0001-wsj_0159"},
                   "valid": {"trees": 40, "words": 160, "skipped": 0, "files": "wsj_0160-wsj_0179"},
                   "test": {"trees": 40, "words": 160, "skipped": 0, "files": "wsj_0180-wsj_0199"}},
        "placeholder": "XX", "target": "words", "source": str(ptb), "spelled_words": 1,
        "phrases": 318, "substituted": 636,
    }
    config = summary["config"]
    assert (config["dataset"], config["synthetic"], config["joint_vocab"]) == (None, None, False)
    assert config["joint_vocab"] is False and summary["spm"]["joint"] is False
    # without data.tgt_vocab_size the word model may hold up to 4096 symbols; it holds what there is
    assert (config["tgt_vocab_size"], config["tgt_spm_model_type"]) == (4096, "word")
    assert summary["spm"]["tgt_vocab_size"] == 4096 and summary["tgt_vocab_size"] == 12
    # the text is written beside the output, in a temporary folder removed afterwards
    text_dir = re.escape(str(out.with_name(".p-text.tmp-")))
    for role in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            assert re.fullmatch(text_dir + f"[0-9a-f]{{8}}/{role}\\.{side}\\.txt", config[f"{role}_{side}"])
    assert sorted(p.name for p in out.parent.iterdir()) == ["p"]
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".gold.txt")) == [
        "test.gold.txt", "train.gold.txt", "valid.gold.txt"]
    assert "encode train: 100%" in progress  # progress is shown by default


def test_prepare_parsing_data_trains_on_the_configured_pairs(prepared: tuple[dict, Path, str, Path],
                                                             tmp_path: Path) -> None:
    """Training pairs: the trees, their phrases and their same-tag variants, as data.parsing_*
    and data.seed ask."""
    _, out, _, ptb = prepared
    write_parsing_text(ptb, tmp_path, target="words", min_count=200, subtrees=2, substitutions=1,
                       substitution_rate=0.25, seed=3)
    src, tgt = split_text(out, "train")
    assert src == (tmp_path / "train.src.txt").read_text(encoding="utf-8").splitlines()
    assert tgt == (tmp_path / "train.tgt.txt").read_text(encoding="utf-8").splitlines()
    # the two trees and their phrases, and the variants' new sentences ("dog" and "yesterday" are NN)
    assert set(src) == {"The dog barks .", "It rained yesterday .", "The dog", "rained yesterday",
                        "The yesterday barks .", "It rained dog .", "The yesterday", "rained dog"}
    for role in ("valid", "test"):
        assert split_text(out, role) == tuple(
            (tmp_path / f"{role}.{side}.txt").read_text(encoding="utf-8").splitlines() for side in ("src", "tgt"))
        assert (out / f"{role}.gold.txt").read_bytes() == (tmp_path / f"{role}.gold.txt").read_bytes()


def test_prepare_parsing_data_draws_the_variants_with_the_configured_seed_and_rate(tmp_path: Path) -> None:
    """data.seed and data.parsing_substitution_rate reach the draw of the variants: the
    prepared pairs are write_parsing_text's with them, which another seed or rate changes."""
    ptb = _mini_treebank(tmp_path / "ptb")
    cfg = DataConfig(vocab_size=40, tgt_vocab_size=64, parsing_substitutions=1, parsing_substitution_rate=0.25,
                     seed=3)
    prepare_parsing_data(ptb, tmp_path / "p", cfg, progress=False)
    drawn = {}
    for rate, seed in ((0.25, 3), (0.5, 3), (0.25, 1)):
        text = tmp_path / f"text-{rate}-{seed}"
        write_parsing_text(ptb, text, substitutions=1, substitution_rate=rate, seed=seed)
        drawn[rate, seed] = (text / "train.src.txt").read_text(encoding="utf-8").splitlines()
    assert split_text(tmp_path / "p", "train")[0] == drawn[0.25, 3]
    assert drawn[0.5, 3] != drawn[0.25, 3] and drawn[0.25, 1] != drawn[0.25, 3]


def test_prepare_parsing_data_refusals_exactly(prepared: tuple[dict, Path, str, Path], tmp_path: Path) -> None:
    ptb = prepared[3]
    a_file = tmp_path / "file"
    a_file.write_text("x", encoding="utf-8")
    with pytest.raises(DataError) as e:
        prepare_parsing_data(ptb, a_file, SMALL_CFG, progress=False)
    assert str(e.value) == f"{a_file}: exists and is not a directory"
    for out in (ptb, ptb.parent):  # not even with force
        with pytest.raises(AiaynError) as ae:
            prepare_parsing_data(ptb, out, SMALL_CFG, progress=False, force=True)
        assert str(ae.value) == f"--out {out}: would replace the input {ptb}; write to another directory"
    assert len(list(ptb.iterdir())) == 199
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_prepare_parsing_data_force_and_rebuild(prepared: tuple[dict, Path, str, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    ptb = prepared[3]
    out = tmp_path / "p"
    out.mkdir()
    (out / "stray.txt").write_text("x", encoding="utf-8")
    with pytest.raises(DataError) as e:
        prepare_parsing_data(ptb, out, SMALL_CFG, progress=False)  # force is off by default
    assert str(e.value) == f"{out}: directory exists and is not empty (use --force to replace it)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]
    summary = prepare_parsing_data(ptb, out, SMALL_CFG, progress=False, force=True)
    assert not (out / "stray.txt").exists() and read_summary(out) == summary
    assert (summary["config"]["tgt_vocab_size"], summary["tgt_vocab_size"]) == (64, 11)
    # a prepared directory is rebuilt without force, reusing its tokenizer
    again = prepare_parsing_data(ptb, out, SMALL_CFG, progress=False)
    assert again["reused"]["tokenizer"] is True and again["input_key"] == summary["input_key"]
    assert capsys.readouterr().err == ""  # progress=False shows none
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]


def test_prepare_parsing_data_failure_is_not_masked_by_the_cleanup(
        prepared: tuple[dict, Path, str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure is reported as itself, even when the temporary text folder is gone already."""
    def failing(ptb_dir: Path, out_dir: Path, **_: object) -> dict:
        shutil.rmtree(out_dir)
        raise DataError(f"{ptb_dir}: no trees")

    monkeypatch.setattr(treebank, "write_parsing_text", failing)
    with pytest.raises(DataError) as e:
        prepare_parsing_data(prepared[3], tmp_path / "p", SMALL_CFG, progress=False)
    assert str(e.value) == f"{prepared[3]}: no trees"
    assert list(tmp_path.iterdir()) == []


@needs_ptb
def test_write_parsing_text_substitutions_default_to_rate_one_half_and_seed_one(tmp_path: Path) -> None:
    ptb, splits = _three_files(tmp_path)
    default, explicit = tmp_path / "default", tmp_path / "explicit"
    summary = write_parsing_text(ptb, default, splits=splits, target="words", substitutions=2)
    assert summary == write_parsing_text(ptb, explicit, splits=splits, target="words", substitutions=2,
                                         substitution_rate=0.5, seed=1)
    assert summary["substituted"] == 2 * 3
    trees = read_trees(default / "train.gold.txt")
    expected = substituted(trees, 2, 0.5, trees, seed=1)
    src = (default / "train.src.txt").read_text(encoding="utf-8").splitlines()
    assert src[3:] == [" ".join(t.leaves()) for t in expected] and src[3:] != src[:3] * 2
    for name in ("train.src.txt", "train.tgt.txt", "train.gold.txt", "test.src.txt"):
        assert (default / name).read_bytes() == (explicit / name).read_bytes()


def test_write_parsing_text_writes_without_fsync(tiny_ptb: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The parallel text is rebuilt from the treebank at will: renamed into place together,
    never fsynced (durable=False), which on a slow disk would cost more than the writing."""
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    write_parsing_text(tiny_ptb, tmp_path / "out", splits={"train": (1, 1), "test": (2, 2)})
    assert calls == [] and len(list((tmp_path / "out").iterdir())) == 6
    treebank.write_all_atomic({tmp_path / "durable.txt": "x"})  # the default: fsynced, as the spy sees
    assert calls
