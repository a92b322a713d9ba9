"""The Penn Treebank as the parsing task's training data (paper, section 6.2).

:func:`write_parsing_text` writes the project's split of the treebank sample as parallel
text: ``{role}.src.txt`` (words), ``{role}.tgt.txt`` (linearized tree, :mod:`aiayn.data.trees`)
and ``{role}.gold.txt`` (cleaned trees with POS tags, one per line, for EVALB); for a small
treebank it can add training pairs (every phrase as a pair of its own; same-tag word
substitution). :func:`prepare_parsing_data` turns that text into a prepared-data directory
(:mod:`aiayn.data.prepare`) like any other task's, with the gold trees beside it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import random
import shutil
from collections import Counter
from collections.abc import Container, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiayn.config import DataConfig
from aiayn.data.prepare import ROLES, is_prepared_dir, prepare_data
from aiayn.data.trees import PLACEHOLDER, TARGETS, Tree, clean_tree, linearize, read_trees_with_lines, tree_to_string
from aiayn.errors import DataError
from aiayn.fileio import check_empty_dir, make_temp_dir, write_all_atomic

logger = logging.getLogger(__name__)

DEFAULT_SPLITS: dict[str, tuple[int, int]] = {
    "train": (1, 159),
    "valid": (160, 179),
    "test": (180, 199),
}
"""The project's split of the NLTK 10% WSJ sample, as inclusive wsj_NNNN file numbers."""


def _split_files(ptb_dir: Path, first: int, last: int) -> list[Path]:
    files = [ptb_dir / f"wsj_{i:04d}.mrg" for i in range(first, last + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise DataError(f"{ptb_dir}: missing {len(missing)} treebank file(s): {', '.join(missing[:5])}")
    return files


def _cleaned_trees(files: list[Path]) -> tuple[list[Tree], int]:
    """The cleaned trees of ``files``, and how many were skipped for having no words."""
    trees: list[Tree] = []
    skipped = 0
    for path in files:
        for line, raw in read_trees_with_lines(path):
            tree = clean_tree(raw)
            if tree is None:
                logger.warning("%s:%d: tree has no words after removing empty elements; skipped", path, line)
                skipped += 1
            else:
                trees.append(tree)
    return trees, skipped


def _parsing_lines(trees: list[Tree], placeholder: str,
                   spell: Container[str]) -> tuple[list[str], list[str], list[str]]:
    """Source, target and gold lines (newline-terminated) of ``trees``."""
    # Words never hold whitespace: the reader splits on it.
    return ([" ".join(tree.leaves()) + "\n" for tree in trees],
            [" ".join(linearize(tree, placeholder, spell=spell)) + "\n" for tree in trees],
            [tree_to_string(tree) + "\n" for tree in trees])


def phrase_subtrees(trees: Iterable[Tree], min_words: int) -> list[Tree]:
    """Every phrase below the root of ``trees`` that spans ``min_words`` words or more, as a
    tree of its own (depth-first, left to right): extra training pairs for a small treebank.
    Each teaches the bracketing of a span without the rest of its sentence (the first
    thousand trees of a treebank hold tens of thousands of such phrases)."""
    out: list[Tree] = []
    for tree in trees:
        stack = list(reversed(tree.children))
        while stack:
            node = stack.pop()
            if node.is_preterminal:
                continue
            if len(node.preterminals()) >= min_words:
                out.append(node)
            stack.extend(reversed(node.children))
    return out


def substituted(trees: Sequence[Tree], copies: int, rate: float, lexicon: Iterable[Tree],
                seed: int = 1) -> list[Tree]:
    """``copies`` variants of each tree of ``trees`` in which each word is replaced, with
    probability ``rate``, by a word of the same POS tag drawn from ``lexicon``'s words by
    their frequency there: new sentences with the same brackets, for a small treebank
    (augmentation by same-tag substitution). Deterministic in ``seed``; ``trees`` unchanged."""
    pool: dict[str, list[str]] = {}
    for tree in lexicon:
        for tag, word in zip(tree.tags(), tree.leaves()):
            pool.setdefault(tag, []).append(word)
    rng = random.Random(seed)
    out: list[Tree] = []
    for _ in range(copies):
        for tree in trees:
            variant = copy.deepcopy(tree)
            for node in variant.preterminals():
                if node.label in pool and rng.random() < rate:
                    node.word = rng.choice(pool[node.label])
            out.append(variant)
    return out


def spelled_words(trees: Iterable[Tree], min_count: int) -> frozenset[str]:
    """The words a ``words`` target spells: those seen ``min_count`` times or more in
    ``trees`` (the training trees); rarer words stay placeholders, so that the target
    vocabulary holds every target token (SentencePiece merges adjacent unknowns)."""
    counts = Counter(word for tree in trees for word in tree.leaves())
    return frozenset(word for word, n in counts.items() if n >= min_count)


def _training_extras(trees: list[Tree], placeholder: str, spell: Container[str], subtrees: int,
                     substitutions: int, rate: float, seed: int) -> tuple[list[str], list[str], dict[str, int]]:
    """The extra training pairs (source and target lines): phrases, then same-tag variants
    of the trees and phrases; and how many of each were made, for the summary."""
    phrases = phrase_subtrees(trees, subtrees) if subtrees > 0 else []
    variants = substituted(trees + phrases, substitutions, rate, trees, seed) if substitutions > 0 else []
    counts: dict[str, int] = {}
    if subtrees > 0:
        counts["phrases"] = len(phrases)
    if substitutions > 0:
        counts["substituted"] = len(variants)
    src, tgt, _ = _parsing_lines(phrases + variants, placeholder, spell)
    return src, tgt, counts


def write_parsing_text(
    ptb_dir: Path | str,
    out_dir: Path | str,
    *,
    splits: Mapping[str, tuple[int, int]] | None = None,
    placeholder: str = PLACEHOLDER,
    target: str = "placeholders",
    min_count: int = 2,
    subtrees: int = 0,
    substitutions: int = 0,
    substitution_rate: float = 0.5,
    seed: int = 1,
) -> dict:
    """Write the parsing task's parallel text for each split role.

    ``ptb_dir`` holds ``wsj_NNNN.mrg`` files (or has them under ``combined/``, as the NLTK
    sample does). ``splits`` maps role -> inclusive file-number range, by default
    :data:`DEFAULT_SPLITS` (train 1-159, valid 160-179, test 180-199). For each role,
    writes ``{role}.src.txt`` (words, space-separated), ``{role}.tgt.txt`` (linearized
    tree) and ``{role}.gold.txt`` (cleaned tree with POS tags) into ``out_dir``, all
    files renamed into place only once all are written. ``target`` is one of
    :data:`TARGETS`; a ``words`` target spells the words seen ``min_count`` times in the
    ``train`` role's trees (:func:`spelled_words`). ``subtrees`` > 0 adds every phrase of
    the ``train`` trees spanning that many words or more as a pair of its own, after the
    whole trees (:func:`phrase_subtrees`; the other roles keep their sentences).
    ``substitutions`` > 0 adds that many variants of every ``train`` pair (trees and phrases)
    with words replaced at ``substitution_rate`` by training words of the same POS tag
    (:func:`substituted`, seeded by ``seed``). Returns
    ``{"splits": {role: {"trees", "words", "skipped", "files": "wsj_0001-wsj_0159"}},
    "placeholder", "target", "source", "spelled_words"}``, plus ``"phrases"`` (how many were
    added) with ``subtrees`` and ``"substituted"`` with ``substitutions``.
    """
    if target not in TARGETS:
        raise DataError(f"parsing target must be one of {', '.join(TARGETS)}, got {target!r}")
    ptb_dir = Path(ptb_dir)
    out_dir = Path(out_dir)
    if not ptb_dir.is_dir():
        raise DataError(f"{ptb_dir}: treebank directory not found")
    if not any(ptb_dir.glob("wsj_*.mrg")) and (ptb_dir / "combined").is_dir():
        ptb_dir = ptb_dir / "combined"  # the NLTK sample's layout
    splits = dict(splits if splits is not None else DEFAULT_SPLITS)

    contents: dict[Path, str] = {}
    summary: dict = {"splits": {}, "placeholder": placeholder, "target": target, "source": str(ptb_dir)}
    trees = {role: _cleaned_trees(_split_files(ptb_dir, first, last)) for role, (first, last) in splits.items()}
    spell = spelled_words(trees.get("train", ([], 0))[0], min_count) if target == "words" else frozenset()
    summary["spelled_words"] = len(spell)
    for role, (first, last) in splits.items():
        src_lines, tgt_lines, gold_lines = _parsing_lines(trees[role][0], placeholder, spell)
        if role == "train":
            src_extra, tgt_extra, counts = _training_extras(trees[role][0], placeholder, spell, subtrees,
                                                            substitutions, substitution_rate, seed)
            src_lines, tgt_lines = src_lines + src_extra, tgt_lines + tgt_extra
            summary.update(counts)
        skipped = trees[role][1]
        contents[out_dir / f"{role}.src.txt"] = "".join(src_lines)
        contents[out_dir / f"{role}.tgt.txt"] = "".join(tgt_lines)
        contents[out_dir / f"{role}.gold.txt"] = "".join(gold_lines)
        summary["splits"][role] = {
            "trees": len(gold_lines),
            "words": sum(len(s.split()) for s in src_lines[:len(gold_lines)]),
            "skipped": skipped,
            "files": f"wsj_{first:04d}-wsj_{last:04d}",
        }
        logger.info("parsing %s: %d trees from wsj_%04d-wsj_%04d", role, len(gold_lines), first, last)

    out_dir.mkdir(parents=True, exist_ok=True)
    write_all_atomic(contents, durable=False)
    return summary


def prepare_parsing_data(ptb_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: DataConfig,
                         progress: bool = True, force: bool = False) -> dict[str, Any]:
    """Constituency parsing (paper, section 6.2) as translation: words -> linearized trees.

    :func:`write_parsing_text` writes the parallel text (and gold trees);
    this turns it into a prepared directory like any other: separate vocabularies, BPE over
    words on the source (``cfg.vocab_size``) and one token per tree symbol on the target
    (a word model sized to the symbols; with ``cfg.parsing_target: words`` the words as well,
    up to ``cfg.tgt_vocab_size`` pieces), ``{role}.gold.txt`` kept beside for EVALB.
    """
    out = check_empty_dir(out_dir, force, DataError, inputs=[ptb_dir], own=is_prepared_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    text_dir = make_temp_dir(out.with_name(out.name + "-text"))
    try:
        text_summary = write_parsing_text(Path(ptb_dir), text_dir, target=cfg.parsing_target,
                                       min_count=cfg.parsing_min_count, subtrees=cfg.parsing_subtrees,
                                       substitutions=cfg.parsing_substitutions,
                                       substitution_rate=cfg.parsing_substitution_rate, seed=cfg.seed)
        files: dict[str, Any] = {}
        gold: dict[str, Path] = {}
        for role in ROLES:
            if (text_dir / f"{role}.src.txt").is_file():
                files[f"{role}_src"] = str(text_dir / f"{role}.src.txt")
                files[f"{role}_tgt"] = str(text_dir / f"{role}.tgt.txt")
            if (text_dir / f"{role}.gold.txt").is_file():
                gold[f"{role}.gold.txt"] = text_dir / f"{role}.gold.txt"
        parsing_cfg = dataclasses.replace(
            cfg, dataset=None, synthetic=None, joint_vocab=False, tgt_spm_model_type="word",
            # An upper bound: the word model keeps every tree symbol there is (soft limit).
            tgt_vocab_size=cfg.tgt_vocab_size or 4096, **files)
        return prepare_data(parsing_cfg, out, progress, extra_files=gold, force=force,
                            extra_summary={"task": "parsing", "parsing": text_summary,
                                           "source": {"dataset": "ptb", "synthetic": None,
                                                      "src_lang": "words", "tgt_lang": "trees"}})
    finally:
        shutil.rmtree(text_dir, ignore_errors=True)

