"""Constrained decoding: a per-hypothesis state that restricts the next token.

The searches (:mod:`aiayn.inference.search`) take a :class:`Constraint` and drive one
:class:`ConstraintState` per search: :meth:`~ConstraintState.mask` sets every illegal
next token of every live row to -inf (vectorised over rows), :meth:`~ConstraintState.select`
follows the rows when beams are reordered or finished rows leave, and
:meth:`~ConstraintState.advance` takes each row's chosen token. The search knows nothing
of what is constrained; a constraint knows nothing of the model.

:class:`TreeConstraint` is the parsing grammar (paper, section 6.2): every output is a
well-formed linearized tree (``(S (NP XX XX )NP ... )S``, :mod:`aiayn.data.trees`) over
exactly the sentence's words.

:class:`LexicalConstraint` is terminology: phrases that must appear in the output, and
phrases that must not. A state that also implements :class:`AllocatingState` has beam
search divide its beam into banks by constraint progress (dynamic beam allocation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from aiayn.vocab import SPECIAL_IDS

NEG_INF = float("-inf")


class ConstraintState(Protocol):
    def mask(self, lprobs: Tensor, t: int) -> None:
        """Set the illegal next tokens of ``lprobs`` (R, V) to -inf, in place, at step ``t``."""

    def select(self, index: Tensor) -> None:
        """Keep rows ``index`` (R',), in that order."""

    def advance(self, tokens: Tensor) -> None:
        """Each row's chosen token (R,)."""


@runtime_checkable
class AllocatingState(ConstraintState, Protocol):
    """A state whose rows beam search divides into banks (dynamic beam allocation): by the
    number of constraint tokens each one has met, from 0 to :meth:`total_tokens`."""

    def total_tokens(self) -> Tensor:
        """(R,) the constraint tokens each row must meet."""

    def met_tokens(self) -> Tensor:
        """(R,) the constraint tokens each row has met (its bank)."""

    def next_tokens(self) -> Tensor:
        """(R, N) tokens that would bring each row further (-1: none), tried as candidates."""

    def met_after(self, rows: Tensor, tokens: Tensor) -> Tensor:
        """(N,) the constraint tokens met by row ``rows[i]`` extended by ``tokens[i]``."""


class Constraint(Protocol):
    def start(self, sent: Tensor, max_len: Tensor) -> ConstraintState:
        """The state of rows whose sentences (in the batch) are ``sent`` (R,), each allowed
        ``max_len`` (R,) tokens before EOS."""


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


class TreeConstraint:
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

    def __init__(self, con: TreeConstraint, n_words: Tensor, slots: Tensor, max_len: Tensor) -> None:
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


# ------------------------------------------------------------------ lexical constraints


def _pad_phrases(per_sentence: Sequence[Sequence[Sequence[int]]]) -> tuple[Tensor, Tensor]:
    """Token phrases per sentence -> (S, C, L) ids padded with -1, and lengths (S, C) (0 for
    the padding phrases of sentences with fewer than C)."""
    n_phrases = max((len(p) for p in per_sentence), default=0)
    width = max((len(x) for p in per_sentence for x in p), default=0)
    ids = torch.full((len(per_sentence), n_phrases, max(width, 1)), -1, dtype=torch.long)
    lengths = torch.zeros(len(per_sentence), n_phrases, dtype=torch.long)
    for s, phrases in enumerate(per_sentence):
        for c, phrase in enumerate(phrases):
            if not phrase:
                raise ValueError("a constraint phrase has no tokens")
            ids[s, c, :len(phrase)] = torch.as_tensor(list(phrase), dtype=torch.long)
            lengths[s, c] = len(phrase)
    return ids, lengths


class LexicalConstraint:
    """Token phrases that must appear (``include``), and phrases that must not (``exclude``),
    per sentence of the batch (lists of token-id lists).

    The state of a row knows, for every ``include`` phrase, whether it has appeared and how
    many of its first tokens end the output so far (its *progress*); the number of tokens a
    row has met is the summed length of its met phrases plus its largest progress. It masks:

    - EOS, until every phrase has appeared;
    - once the tokens left before the length bound no longer hold every unmet phrase written
      whole, any token after which they would not fit (the unmet phrases' lengths, less the
      largest progress, must fit in what is left): so every output that ends meets all of
      them, in greedy search and sampling too;
    - the last token of an ``exclude`` phrase whose other tokens end the output so far (a
      one-token phrase: always).

    For beam search it also offers what dynamic beam allocation (Post & Vilar 2018) needs:
    the tokens that bring each row further along a phrase (:meth:`next_tokens`), to be tried beside the best
    candidates, and the tokens met by a row extended by a token (:meth:`met_after`), so that
    the beam is divided into banks by that number and hypotheses that met more of their
    phrases are not crowded out by likelier ones that met fewer.

    A phrase listed twice counts once; one inside another is met with it.
    """

    def __init__(self, include: Sequence[Sequence[Sequence[int]]],
                 exclude: Sequence[Sequence[Sequence[int]]] | None = None, eos: int = 3) -> None:
        if exclude is None:
            exclude = [[] for _ in include]
        if len(exclude) != len(include):
            raise ValueError(f"{len(include)} sentences of include phrases, {len(exclude)} of exclude phrases")
        self.include, self.include_len = _pad_phrases([list(dict.fromkeys(map(tuple, p))) for p in include])
        self.exclude, self.exclude_len = _pad_phrases([list(dict.fromkeys(map(tuple, p))) for p in exclude])
        self.eos = eos

    def start(self, sent: Tensor, max_len: Tensor) -> LexicalState:
        dev = max_len.device
        sent = sent.to(dev)
        return LexicalState(self.include.to(dev)[sent], self.include_len.to(dev)[sent],
                            self.exclude.to(dev)[sent], self.exclude_len.to(dev)[sent], max_len.clone(), self.eos)


def _suffix_matches(recent: Tensor, phrases: Tensor, upto: int) -> list[Tensor]:
    """``out[j]`` (R, C) bool, j = 0..upto: the last j tokens of ``recent`` (R, W) equal the
    first j of phrase c (R, C, L); j = 0 is always true."""
    rows, n_phrases = phrases.shape[:2]
    out = [torch.ones(rows, n_phrases, dtype=torch.bool, device=recent.device)]
    width = recent.size(1)
    for j in range(1, upto + 1):
        out.append((recent[:, None, width - j:] == phrases[:, :, :j]).all(dim=-1))
    return out


class LexicalState:
    """Per row: the last tokens (enough to match the longest phrase), which ``include``
    phrases have appeared, and each one's progress."""

    def __init__(self, include: Tensor, include_len: Tensor, exclude: Tensor, exclude_len: Tensor,
                 max_len: Tensor, eos: int) -> None:
        self.include, self.include_len = include, include_len  # (R, C, L), (R, C)
        self.exclude, self.exclude_len = exclude, exclude_len  # (R, N, M), (R, N)
        self.max_len = max_len
        self.eos = eos
        width = max(include.size(2), exclude.size(2), 1)
        rows = max_len.numel()
        self.recent = torch.full((rows, width), -1, dtype=torch.long, device=max_len.device)
        self.met = include_len == 0  # padding phrases count as met
        self.progress = torch.zeros_like(include_len)

    # ---------------------------------------------------------------- bookkeeping

    def _match(self, recent: Tensor, met: Tensor, include: Tensor, include_len: Tensor) -> tuple[Tensor, Tensor]:
        """(met, progress) of rows whose last tokens are ``recent`` and that had met ``met``."""
        met = met.clone()
        progress = torch.zeros_like(include_len)
        for j, match in enumerate(_suffix_matches(recent, include, include.size(2))):
            if j == 0:
                continue
            met |= match & (include_len == j)
            progress = torch.where(match & (j < include_len), j, progress)
        return met, torch.where(met, 0, progress)

    def _need(self) -> Tensor:
        """(R,) tokens still needed to write every unmet phrase."""
        left = torch.where(self.met, 0, self.include_len).sum(dim=1)
        return left - self.progress.amax(dim=1) if self.progress.size(1) else left

    def total_tokens(self) -> Tensor:
        """(R,) the summed length of each row's phrases: the highest bank."""
        return self.include_len.sum(dim=1)

    def met_tokens(self) -> Tensor:
        """(R,) the tokens met: the lengths of the met phrases plus the largest progress."""
        return self.total_tokens() - self._need()

    def next_tokens(self, rows: Tensor | None = None) -> Tensor:
        """(R, C * L) the tokens that bring each row (of ``rows``; all by default) further
        along an unmet phrase: ``phrase[j]`` wherever the row's last j tokens are that
        phrase's first j (j = 0: every phrase's first token); -1 pads."""
        include, include_len, met, recent = self.include, self.include_len, self.met, self.recent
        if rows is not None:
            include, include_len, met, recent = include[rows], include_len[rows], met[rows], recent[rows]
        longest = include.size(2)
        out = [torch.where(match & (j < include_len) & ~met, include[:, :, j], -1)
               for j, match in enumerate(_suffix_matches(recent, include, longest - 1))]
        return torch.stack(out, dim=2).flatten(1)

    def met_after(self, rows: Tensor, tokens: Tensor) -> Tensor:
        """(N,) the tokens met by row ``rows[i]`` extended by ``tokens[i]``."""
        recent = torch.cat([self.recent[rows, 1:], tokens[:, None]], dim=1)
        include, include_len = self.include[rows], self.include_len[rows]
        met, progress = self._match(recent, self.met[rows], include, include_len)
        left = torch.where(met, 0, include_len).sum(dim=1)
        if progress.size(1):
            left = left - progress.amax(dim=1)
        return include_len.sum(dim=1) - left

    # ------------------------------------------------------------- the protocol

    def mask(self, lprobs: Tensor, t: int) -> None:
        self._ban_excluded(lprobs)
        lprobs[:, self.eos] = torch.where(self._need() > 0, NEG_INF, lprobs[:, self.eos])
        # Tokens left after this one before the length bound. A token that brings no phrase
        # further leaves every unmet phrase to be written whole; where that no longer fits,
        # only the tokens after which the unmet phrases still fit are kept.
        room = self.max_len - t - 1
        left = torch.where(self.met, 0, self.include_len).sum(dim=1)
        forced = (left > 0) & (left > room)
        if not bool(forced.any()):
            return
        rows = forced.nonzero(as_tuple=True)[0]
        tokens = self.next_tokens(rows)  # (F, C * L)
        per_row = tokens.size(1)
        met_after = self.met_after(rows.repeat_interleave(per_row), tokens.clamp(min=0).flatten())
        need_after = self.total_tokens()[rows, None] - met_after.view(-1, per_row)
        allowed = torch.where((tokens >= 0) & (need_after <= room[rows, None]), tokens, -1)
        keep = torch.full((rows.numel(), lprobs.size(1)), NEG_INF, device=lprobs.device, dtype=lprobs.dtype)
        values = lprobs[rows].gather(1, allowed.clamp(min=0))
        # -1 pads land on column 0 (PAD, never an output) with -inf.
        keep.scatter_(1, allowed.clamp(min=0), torch.where(allowed >= 0, values, NEG_INF))
        lprobs[rows] = keep

    def _ban_excluded(self, lprobs: Tensor) -> None:
        if self.exclude.size(1) == 0:
            return
        longest = self.exclude.size(2)
        for j, match in enumerate(_suffix_matches(self.recent, self.exclude, longest - 1)):
            # Phrases of j + 1 tokens whose first j end the output: their last token is banned.
            ban = match & (self.exclude_len == j + 1)
            rows, which = ban.nonzero(as_tuple=True)
            if rows.numel():
                lprobs[rows, self.exclude[rows, which, j]] = NEG_INF

    def select(self, index: Tensor) -> None:
        for name in ("include", "include_len", "exclude", "exclude_len", "max_len", "recent", "met", "progress"):
            setattr(self, name, getattr(self, name).index_select(0, index))

    def advance(self, tokens: Tensor) -> None:
        self.recent = torch.cat([self.recent[:, 1:], tokens[:, None]], dim=1)
        self.met, self.progress = self._match(self.recent, self.met, self.include, self.include_len)
