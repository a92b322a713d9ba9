"""The parsing grammar as a search constraint (paper, section 6.2): every output is a
well-formed linearized tree (``(S (NP XX XX )NP ... )S``, :mod:`aiayn.data.trees`) over
exactly the sentence's words.

:class:`TreeVocab` names the target ids of the tree symbols; :class:`TreeGrammar` is the
:class:`aiayn.inference.constraints.Constraint` a search drives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.inference.constraints import NEG_INF
from aiayn.vocab import SPECIAL_IDS


@dataclass(frozen=True)
class TreeVocab:
    """The target ids of the tree symbols: ``open_ids[i]``/``close_ids[i]`` are label i's
    ``(X`` and ``)X``; ``placeholder`` is the word slot ``XX`` (in a target that spells its
    words, the slot of a word outside the vocabulary)."""

    open_ids: tuple[int, ...]
    close_ids: tuple[int, ...]
    placeholder: int
    eos: int
    vocab_size: int

    @classmethod
    def from_pieces(cls, pieces: Sequence[str], placeholder: str, eos: int) -> TreeVocab:
        """From the target vocabulary (piece of each id): every label with both brackets.
        SentencePiece's word-boundary mark ``▁`` is ignored (one piece per symbol)."""
        index = {p.removeprefix("\u2581"): i for i, p in enumerate(pieces)}
        labels = sorted(p[1:] for p in index if p.startswith("(") and len(p) > 1 and ")" + p[1:] in index)
        if placeholder not in index or not labels:
            raise ValueError(f"the target vocabulary has no tree symbols ({placeholder!r}, '(X', ')X')")
        return cls(tuple(index["(" + lab] for lab in labels), tuple(index[")" + lab] for lab in labels),
                   index[placeholder], eos, len(pieces))


class TreeGrammar:
    """Outputs that are well-formed trees over ``n_words[s]`` words for sentence ``s``.

    A token is legal when the tree can still be finished within the row's length bound:

    - ``(X``: before the root closes, below ``max_depth``, while a word is left to put in it;
    - ``XX``: inside a bracket, while words are left;
    - ``)X``: only for the innermost open label, once it holds something; the root only
      once every word is placed;
    - EOS: only after the root has closed; nothing else then.

    Every bracket holds at least one word, so a row always has a legal token: an open
    bracket that holds nothing was opened while a word was left, and that word can go in
    it; the length rule keeps room for the words left and one closing per open bracket.
    """

    def __init__(self, vocab: TreeVocab, n_words: Sequence[int], max_depth: int = 64,
                 word_ids: Sequence[Sequence[int]] | None = None, any_word: bool = False) -> None:
        """``word_ids``: a target that spells its words; each word slot takes that word's
        own token. ``any_word``: score that token by the model's belief that *a* word comes
        next (the log of the summed probability of every token that is not a tree symbol or a
        special), not by its belief in that word: the words are given, not predicted, and a
        model that expects another word here must not be pushed into opening brackets."""
        self.vocab = vocab
        self.any_word = any_word
        self.n_words = torch.as_tensor(list(n_words), dtype=torch.long)
        self.max_depth = max_depth
        # slots[s, i]: the token that places word i of sentence s: the placeholder, or with
        # ``word_ids`` (a target that spells the words) that word's own id. One spare
        # column past the longest sentence keeps a finished row's lookup in range.
        width = int(self.n_words.max()) + 1 if len(self.n_words) else 1
        self.slots = torch.full((len(self.n_words), width), vocab.placeholder, dtype=torch.long)
        if word_ids is not None:
            if [len(w) for w in word_ids] != self.n_words.tolist():
                raise ValueError("word_ids must hold one id per word of each sentence")
            for s, ids in enumerate(word_ids):
                self.slots[s, :len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)

    def start(self, sent: Tensor, max_len: Tensor) -> _TreeState:
        sent = sent.to(max_len.device)
        return _TreeState(self, self.n_words.to(sent.device)[sent], self.slots.to(sent.device)[sent], max_len.clone())


class _TreeState:
    """Per row: open labels (a stack), what is placed, and how many tokens are left."""

    def __init__(self, con: TreeGrammar, n_words: Tensor, slots: Tensor, max_len: Tensor) -> None:
        v, dev, rows = con.vocab, max_len.device, n_words.numel()
        self.max_depth = con.max_depth
        self.open_ids = torch.tensor(v.open_ids, device=dev)
        self.close_ids = torch.tensor(v.close_ids, device=dev)
        self.eos = v.eos
        # id -> label index, -1 for anything that is not a bracket of that kind.
        self.open_label = torch.full((v.vocab_size,), -1, dtype=torch.long, device=dev)
        self.open_label[self.open_ids] = torch.arange(len(v.open_ids), device=dev)
        self.close_label = torch.full((v.vocab_size,), -1, dtype=torch.long, device=dev)
        self.close_label[self.close_ids] = torch.arange(len(v.close_ids), device=dev)
        self.n_words, self.slots, self.max_len = n_words, slots, max_len
        # For ``any_word``: the columns that are not words (tree symbols and specials), a
        # few dozen, so that the word mass is found as 1 - their mass without a pass over
        # the whole vocabulary (the scores are log-probabilities; a search mask that removed
        # EOS before this one leaves its mass to the words, at most P(EOS)).
        self.not_words: Tensor | None = None
        if con.any_word:
            self.not_words = torch.cat([self.open_ids, self.close_ids,
                                        torch.tensor(sorted(SPECIAL_IDS), device=dev)])
        self.placed = torch.zeros(rows, dtype=torch.long, device=dev)
        self.depth = torch.zeros(rows, dtype=torch.long, device=dev)
        self.stack = torch.zeros(rows, con.max_depth, dtype=torch.long, device=dev)  # label per depth
        self.filled = torch.zeros(rows, con.max_depth, dtype=torch.bool, device=dev)  # holds something
        self.started = torch.zeros(rows, dtype=torch.bool, device=dev)

    def mask(self, lprobs: Tensor, t: int) -> None:
        words_left = self.n_words - self.placed
        # Tokens still needed to finish after this step's token, before EOS: one per word
        # left, one closing per open bracket (two for a root not yet opened).
        need = words_left + self.depth + (~self.started).long() * 2
        room = self.max_len - t - 1  # free tokens after this one
        inside = self.depth > 0
        done = self.started & ~inside
        top = (self.depth - 1).clamp(min=0)[:, None]
        top_filled = self.filled.gather(1, top)[:, 0]
        # Opening the root turns its two pending tokens into one; any other bracket adds one.
        need_after_open = torch.where(self.started, need + 1, need - 1)
        open_ok = ~done & (self.depth < self.max_depth) & (words_left > 0) & (need_after_open <= room)
        open_ok &= inside | ~self.started
        xx_ok = inside & (words_left > 0) & (need - 1 <= room)
        close_ok = inside & top_filled & ((self.depth > 1) | (words_left == 0))
        close_id = self.close_ids[self.stack.gather(1, top)[:, 0]]
        keep = torch.full_like(lprobs, NEG_INF)
        keep[:, self.open_ids] = torch.where(open_ok[:, None], lprobs[:, self.open_ids], NEG_INF)
        keep[:, self.eos] = torch.where(done, lprobs[:, self.eos], NEG_INF)
        word = self._next_word()[:, None]
        word_lp = lprobs.gather(1, word)[:, 0]
        if self.not_words is not None:
            rest = lprobs[:, self.not_words].logsumexp(-1).clamp(max=0.0)
            # log(1 - e^rest), never below the word's own score (rounding when rest ~ 0).
            word_lp = torch.maximum(torch.log(-torch.expm1(rest)), word_lp)
        keep.scatter_(1, word, torch.where(xx_ok, word_lp, NEG_INF)[:, None])
        keep.scatter_(1, close_id[:, None], torch.where(close_ok, lprobs.gather(1, close_id[:, None])[:, 0],
                                                        NEG_INF)[:, None])
        lprobs.copy_(keep)

    def _next_word(self) -> Tensor:
        """Each row's token for its next word (the placeholder, or the word itself)."""
        at = self.placed.clamp(max=self.slots.shape[1] - 1)
        return self.slots.gather(1, at[:, None])[:, 0]

    def select(self, index: Tensor) -> None:
        for name in ("n_words", "slots", "max_len", "placed", "depth", "stack", "filled", "started"):
            setattr(self, name, getattr(self, name).index_select(0, index))

    def advance(self, tokens: Tensor) -> None:
        rows = torch.arange(tokens.numel(), device=tokens.device)
        opened = self.open_label[tokens]
        is_open, is_close = opened >= 0, self.close_label[tokens] >= 0
        is_xx = (tokens == self._next_word()) & (self.placed < self.n_words)
        # The innermost bracket now holds something (a word or a new bracket).
        parent = (self.depth - 1).clamp(min=0)
        self.filled[rows, parent] |= (is_open | is_xx) & (self.depth > 0)
        self.placed += is_xx.long()
        at = self.depth.clamp(0, self.max_depth - 1)
        self.stack[rows, at] = torch.where(is_open, opened, self.stack[rows, at])
        self.filled[rows, at] &= ~is_open
        # Clamped: a dead beam (score -inf, kept only to fill the beam) may be extended by an
        # illegal token; its state must stay a valid index, it can never win.
        self.depth = (self.depth + is_open.long() - is_close.long()).clamp(0, self.max_depth)
        self.started |= is_open
