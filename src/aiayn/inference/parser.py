"""Constituency parsing with a trained checkpoint: words in, valid trees out (section 6.2).

    parser = Parser.from_checkpoint("runs/ptb_parsing/averaged")
    results = parser.parse(["Ms. Haag plays Elianti ."])     # beam 21, alpha 0.3, |x| + 300
    tree_to_string(results[0].tree)   # "(S (NP (XX Ms.) (XX Haag)) (VP (XX plays) ...) (XX .))"
    scores, results = parse_prepared_split(parser, "data-bin/ptb_parsing", "test")

The model "translates" a sentence into a linearized tree (``(S (NP XX XX )NP ... )S``,
:mod:`aiayn.data.trees`); each prediction is rebuilt over the input words with
:func:`aiayn.data.trees.rebuild`, which repairs malformed output, so every sentence gets
exactly one tree whose leaves are its words. How many needed a repair is counted, since a
high count means the model has not learnt the bracket grammar. Trees are scored with
:func:`aiayn.evaluation.evalb.evalb` (EVALB, COLLINS.prm). The parser predicts no POS
tags: every preterminal is ``XX``; EVALB finds punctuation with the gold tags.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from aiayn.config import Config
from aiayn.data.trees import PLACEHOLDER, TARGETS, Tree, as_placeholders, is_well_formed, read_trees_with_lines, rebuild
from aiayn.errors import DataError
from aiayn.evaluation.evalb import evalb
from aiayn.inference.request import TranslationRequest
from aiayn.inference.search import max_output_lengths
from aiayn.inference.translator import Translator
from aiayn.inference.tree_grammar import TreeGrammar, TreeVocab
from aiayn.vocab import EOS_ID, UNK_ID

log = logging.getLogger(__name__)

PARSING_DECODE: dict[str, Any] = {"beam": 21, "lenpen": 0.3, "max_len_a": 1.0, "max_len_b": 300}
"""Section 6.2: beam 21, alpha 0.3, maximum output length = input length + 300. The input
length is the search's (source BPE pieces + EOS), at least the number of words + 1, so the
bound is never tighter than the paper's."""

# The treebank writes brackets in words as -LRB- / -RRB- (and braces -LCB- / -RCB-): the
# model was trained on those spellings, and a literal bracket would break the tree format.
_PTB_ESCAPES = {"(": "-LRB-", ")": "-RRB-", "{": "-LCB-", "}": "-RCB-"}


def ptb_escape(word: str) -> str:
    """A raw word as the treebank spells it: ``(`` -> ``-LRB-`` and so on."""
    if word in _PTB_ESCAPES:
        return _PTB_ESCAPES[word]
    for char, escaped in _PTB_ESCAPES.items():
        word = word.replace(char, escaped)
    return word


@dataclass
class ParseResult:
    """The parse of one sentence.

    Attributes:
        words: The sentence's words, PTB-escaped: the leaves of ``tree``.
        tree: The tree over ``words`` (``aiayn.data.trees.tree_to_string`` writes it in
            PTB bracket notation); None only for a sentence without words.
        tokens: The predicted linearization, as decoded.
        repaired: The prediction was not one well-formed tree over the words.
    """

    words: list[str]
    tree: Tree | None  # None only for a sentence without words
    tokens: list[str] = field(default_factory=list)  # the predicted linearization, as decoded
    repaired: bool = False  # the prediction was not one well-formed tree over the words


def to_tree(tokens: Sequence[str], words: Sequence[str], placeholder: str = PLACEHOLDER) -> ParseResult:
    """One predicted linearization -> a :class:`ParseResult` over ``words`` (repaired if
    malformed, and marked so). No words: ``tree=None``."""
    if not words:
        return ParseResult(list(words), None, list(tokens))
    repaired = not is_well_formed(tokens, len(words), placeholder)
    return ParseResult(list(words), rebuild(tokens, words, placeholder=placeholder), list(tokens), repaired)


class Parser:
    """A [Translator][aiayn.inference.translator.Translator] trained on linearized trees,
    plus the rebuild into trees.

    Decoding uses ``PARSING_DECODE`` (the paper's parsing settings: beam 21, alpha 0.3,
    output length up to input length + 300) over the checkpoint's ``decode`` section;
    keyword overrides to [parse][aiayn.inference.parser.Parser.parse] win over both.
    """

    def __init__(self, translator: Translator, placeholder: str = PLACEHOLDER, target: str | None = None) -> None:
        """``target``: what stands for a word in the model's trees (``aiayn.data.trees.TARGETS``);
        by default the checkpoint's ``data.parsing_target`` (placeholders for older ones)."""
        self.translator = translator
        self.placeholder = placeholder
        if target is None:
            config = translator.config
            target = config.data.parsing_target if isinstance(config, Config) else "placeholders"
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        self.target = target

    @classmethod
    def from_checkpoint(cls, path: str | Path | Sequence[str | Path], device: str = "cpu",
                        dtype: str = "auto", ensemble: bool = False) -> Parser:
        """Load a parsing checkpoint (trained with ``configs/ptb_parsing.yaml``).

        Args:
            path: What [Translator.from_checkpoint][aiayn.inference.translator.Translator.from_checkpoint]
                accepts; several paths: their weights are averaged.
            ensemble: Several paths: parse with the ensemble of their models instead.
            device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
            dtype: ``auto`` (default; see ``Translator.from_checkpoint``), ``fp32``, ``bf16``,
                ``fp16`` (GPU only) or ``int8`` (CPU only).

        Returns:
            The parser.

        Raises:
            DataError: The checkpoint's target vocabulary has no tree symbols (it is not a
                parser).
            CheckpointError: A missing, incomplete or corrupted checkpoint.

        Example:
            ```python
            from aiayn.data.trees import tree_to_string

            parser = Parser.from_checkpoint("runs/ptb_parsing/averaged")
            result = parser.parse(["Ms. Haag plays Elianti ."])[0]
            tree_to_string(result.tree)  # "(S (NP (XX Ms.) (XX Haag)) (VP (XX plays) ...) (XX .))"
            ```
        """
        parser = cls(Translator.from_checkpoint(path, device=device, dtype=dtype, ensemble=ensemble))
        try:
            _ = parser.tree_vocab  # read once here: a checkpoint that is not a parser fails at load
        except ValueError:
            where = path if isinstance(path, (str, Path)) else path[0]
            raise DataError(f"{where}: not a parsing checkpoint: its target vocabulary has no tree symbols "
                            f"('(X', ')X', {parser.placeholder!r}); train one with configs/ptb_parsing.yaml") from None
        return parser

    def decode_settings(self, **overrides: Any) -> dict[str, Any]:
        """The paper's parsing settings with ``overrides`` (None values ignored), validated."""
        settings = {**PARSING_DECODE, **{k: v for k, v in overrides.items() if v is not None}}
        self.translator.decode_config(**settings)  # raises ConfigError on a bad option
        return settings

    @cached_property
    def tree_vocab(self) -> TreeVocab:
        """The target ids of the tree symbols (ValueError if the vocabulary has none)."""
        tok = self.translator.tokenizer
        return TreeVocab.from_pieces(tok.tgt_pieces(range(tok.tgt_vocab_size)), self.placeholder, EOS_ID)

    def tree_constraint(self, word_lists: Sequence[Sequence[str]]) -> Callable[[list[int]], TreeGrammar]:
        """The grammar for sentences of ``word_lists``, per batch of their indices: trees over
        exactly their words (spelled as the target spells them when it holds the words)."""
        vocab = self.tree_vocab
        if self.target == "placeholders":
            return lambda batch: TreeGrammar(vocab, [len(word_lists[i]) for i in batch])
        ids = [self._word_ids(words, vocab.placeholder) for words in word_lists]
        return lambda batch: TreeGrammar(vocab, [len(ids[i]) for i in batch], word_ids=[ids[i] for i in batch],
                                         any_word=True)

    def _word_ids(self, words: Sequence[str], placeholder: int) -> list[int]:
        """The target id of each word; the placeholder's for a word the target vocabulary
        lacks (a rare word, written as the placeholder in the training trees)."""
        pieces = self.translator.tokenizer.encode_tgt_batch(list(words))
        return [p[0] if len(p) == 1 and p[0] != UNK_ID else placeholder for p in pieces]

    def length_problem(self, word_lists: Sequence[Sequence[str]], settings: dict[str, Any]) -> tuple[int, str] | None:
        """The first sentence (index, why) the model cannot parse whole with ``settings``
        (:meth:`decode_settings`): more source tokens than its positions, or a tree over its
        words (two brackets, one token per word) longer than the output bound."""
        tr = self.translator
        src_lens = tr.source_lengths([" ".join(ptb_escape(w) for w in words) for words in word_lists])
        # The search's own bound (a * |x| + b, within the model's positions).
        bounds = max_output_lengths(torch.tensor(src_lens, dtype=torch.long), tr.decode_config(**settings),
                                    tr.engine.limits.steps).tolist()
        for i, (words, n_src, bound) in enumerate(zip(word_lists, src_lens, bounds)):
            if not words:
                continue
            if tr.max_src_len is not None and n_src > tr.max_src_len:
                return i, (f"{len(words)} words make {n_src} source tokens (with EOS); the model has "
                           f"{tr.max_src_len} positions: split the sentence")
            if len(words) + 2 > bound:
                return i, (f"{len(words)} words need a tree of at least {len(words) + 2} tokens; the output "
                           f"may hold {bound} (model positions, --max-len-a/--max-len-b)")
        return None

    def parse(self, sentences: Sequence[str | Sequence[str]],
              progress: Callable[[int], None] | None = None, constrained: bool = True,
              **decode_overrides: Any) -> list[ParseResult]:
        """Parse each sentence (a string of space-separated words, or a list of words).

        Words are PTB-escaped (``ptb_escape``: ``(`` -> ``-LRB-`` ...) before decoding.
        Returns one [ParseResult][aiayn.inference.parser.ParseResult] per sentence, in
        input order; a sentence without words gets ``tree=None``. ``progress`` is called
        with the number of sentences done per batch. ``constrained`` (default): the search
        may only produce well-formed trees over exactly the sentence's words
        (``aiayn.inference.tree_grammar.TreeGrammar``), so no output needs a repair;
        False decodes freely and repairs (the paper's setting).
        """
        settings = self.decode_settings(**decode_overrides)
        word_lists = [[ptb_escape(w) for w in (s.split() if isinstance(s, str) else s)] for s in sentences]
        texts = [" ".join(words) for words in word_lists]
        t0 = time.perf_counter()
        decode = self.translator.decode_config(**{**settings, "nbest": 1})
        request = TranslationRequest(texts, decode, progress=progress,
                                     grammar=self.tree_constraint(word_lists) if constrained else None)
        outputs = self.translator.run(request) if texts else []
        translations = [r.hypotheses[0].text if r.hypotheses else "" for r in outputs]
        # The target vocabulary is one piece per tree symbol, so the decoded text splits
        # back into symbols on spaces (an <unk> becomes a token rebuild() drops).
        results = [to_tree(self._symbols(text), words, self.placeholder)
                   for words, text in zip(word_lists, translations)]
        n_repaired = sum(r.repaired for r in results)
        log.info("parsed %d sentences in %.1f s (beam %d, lenpen %g, max length %g * input + %d); "
                 "%d needed repair", len(results), time.perf_counter() - t0, settings["beam"],
                 settings["lenpen"], settings["max_len_a"], settings["max_len_b"], n_repaired)
        return results

    def _symbols(self, text: str) -> list[str]:
        """A decoded prediction as tree symbols (words read as placeholders)."""
        tokens = text.split()
        return tokens if self.target == "placeholders" else as_placeholders(tokens, self.placeholder)


def score_parses(gold_trees: Sequence[Tree | str], results: Sequence[ParseResult]) -> dict[str, Any]:
    """EVALB scores of ``results`` against ``gold_trees`` (sentence i against sentence i),
    plus ``repaired`` (predictions that needed a repair) and ``parsed`` (sentences)."""
    if any(r.tree is None for r in results):
        raise DataError("cannot score an empty sentence: every gold tree has words")
    trees = [r.tree for r in results if r.tree is not None]
    scores = evalb(gold_trees, trees)
    scores["parsed"] = len(results)
    scores["repaired"] = sum(r.repaired for r in results)
    return scores


def read_gold(path: str | Path) -> list[Tree]:
    """Gold trees of a file (one per line or ``.mrg`` layout); an error if there are none."""
    trees = [tree for _, tree in read_trees_with_lines(path)]
    if not trees:
        raise DataError(f"{path}: no trees")
    return trees


def parse_prepared_split(parser: Parser, prepared_dir: str | Path, split: str,
                         progress: Callable[[int], None] | None = None,
                         **decode_overrides: Any) -> tuple[dict[str, Any], list[ParseResult]]:
    """Parse and score one split of a ``aiayn prepare --task parsing`` directory.

    The input words are the leaves of ``{split}.gold.txt`` (the same words as
    ``{split}.src.txt``), so the trees always align with the gold ones. Returns the
    scores of :func:`score_parses` (with ``split`` and ``seconds``) and the parses.
    """
    path = Path(prepared_dir) / f"{split}.gold.txt"
    if not path.is_file():
        raise DataError(f"{path}: not found; is {prepared_dir} prepared with `aiayn prepare --task parsing` "
                        f"and a {split} split?")
    gold = read_gold(path)
    t0 = time.perf_counter()
    results = parser.parse([tree.leaves() for tree in gold], progress=progress, **decode_overrides)
    seconds = time.perf_counter() - t0
    scores = score_parses(gold, results)
    scores.update(split=split, seconds=round(seconds, 3))
    log.info("%s: F1 %.2f (P %.2f, R %.2f), exact %.2f, %d of %d repaired", split, scores["f1"],
             scores["precision"], scores["recall"], scores["exact_match"], scores["repaired"], len(gold))
    return scores, results
