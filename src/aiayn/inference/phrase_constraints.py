"""Terminology as a search constraint: target token phrases that must appear in the
output, and phrases that must not.

:class:`PhraseConstraint` is the :class:`aiayn.inference.constraints.Constraint` a search
drives; its states implement :class:`aiayn.inference.constraints.AllocatingState`, so beam
search divides its beam into banks by constraint progress (dynamic beam allocation). The
phrases as users give them (text) are :mod:`aiayn.inference.terms`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from aiayn.inference.constraints import NEG_INF
from aiayn.vocab import EOS_ID


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


class PhraseConstraint:
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
                 exclude: Sequence[Sequence[Sequence[int]]] | None = None, eos: int = EOS_ID) -> None:
        if exclude is None:
            exclude = [[] for _ in include]
        if len(exclude) != len(include):
            raise ValueError(f"{len(include)} sentences of include phrases, {len(exclude)} of exclude phrases")
        self.include, self.include_len = _pad_phrases([list(dict.fromkeys(map(tuple, p))) for p in include])
        self.exclude, self.exclude_len = _pad_phrases([list(dict.fromkeys(map(tuple, p))) for p in exclude])
        self.eos = eos

    def start(self, sent: Tensor, max_len: Tensor) -> PhraseState:
        dev = max_len.device
        sent = sent.to(dev)
        return PhraseState(self.include.to(dev)[sent], self.include_len.to(dev)[sent],
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


class PhraseState:
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
