"""Decoding over a vocabulary shortlist (``--shortlist``; the lists: :mod:`aiayn.text.shortlist`).

:class:`SentenceShortlistDecoder` is the fast one, for a single model: each few sentences
(:data:`SENTENCES_PER_LIST`) score their own list only, and the step returns those columns, not
the vocabulary (the search's :class:`~aiayn.inference.search.StepColumns`), so the projection,
the log-softmax and the top-k all run over the list's columns. The projection is one batched
matmul of each list's rows (hypotheses) with its rows of the output weight, gathered once per
batch.

:class:`ShortlistDecoder` serves the rest (ensembles, compiled steps, constraints, which need
whole-vocabulary scores); it wraps a batch's decoder: each step scores only ``rows`` (the
batch's shortlist), every other piece gets a score of -inf, so the search never emits it.
On a single model the projection itself runs over those rows only -- the saving: a
(R, D) x (D, K) product instead of (D, V) -- and the few hundred or thousand scores are
scattered into a -inf row of the full vocabulary. With the float projection
(:class:`~aiayn.inference.optimize.TransposedProjection`) its columns are selected; with the
int8 one (:class:`~aiayn.inference.quantize.Int8Linear`) the batch's rows of the float weight
are quantized into a small int8 layer of their own, which gives the same scores as the full
layer (the quantization is per row). Elsewhere (ensembles, compiled steps) the full step runs
and is masked: the same outputs, no saving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aiayn.inference.adapters import IncrementalDecoder
from aiayn.inference.optimize import TransposedProjection
from aiayn.inference.quantize import Int8Linear
from aiayn.runtime import native_bf16
from aiayn.vocab import PAD_ID

# Sentences that share one list (the union of theirs): one sentence's list is a few hundred
# pieces, but its rows of the output weight, read at every step for a few hypotheses each, make
# the projection memory-bound; a few sentences per list share those reads. 4 was the fastest
# of 1, 4, 8 and 16 on the Multi30k model (docs/results.md).
SENTENCES_PER_LIST = 4

# The lists' weights are gathered again, for the lists still decoding, when fewer than this
# share of those held are left: the copies stay within a few times the first.
REGATHER_BELOW = 0.75


@dataclass
class _SentenceRows:
    """A :class:`SentenceShortlistDecoder`'s state: the inner decoder's, each row's list, and
    the lists and weights held (a superset of the rows' lists). It is also the search's view
    of the step's columns (:class:`~aiayn.inference.search.StepColumns`)."""

    inner: Any
    row_list: Tensor  # (R,) each row's list
    held: Tensor  # (H,) the lists held, ascending
    lists: Tensor  # (H, C) their target ids, PAD after each list's end
    weight: Tensor  # (H, C, D) their rows of the output weight
    bias: Tensor  # (H, C) their output bias, -inf after each list's end
    vocab_size: int
    slot: Tensor | None = None  # (R,) each row's list's index in held
    pos: Tensor | None = None  # (R,) each row's place among its list's rows; None: rows are (H, g)
    rows_per_list: int = 1  # g: the most rows of one list
    inverse: Tensor | None = None  # (H, V) the column of each id in each list, once asked for

    def ids(self, rows: Tensor, cols: Tensor) -> Tensor:
        assert self.slot is not None
        return self.lists[self.slot[rows], cols]

    def columns(self, rows: Tensor, ids: Tensor) -> Tensor:
        assert self.slot is not None
        if self.inverse is None:
            lists = self.lists
            cols = torch.arange(lists.size(1), device=lists.device).expand_as(lists)
            self.inverse = torch.full((lists.size(0), self.vocab_size), PAD_ID, dtype=torch.long,
                                      device=lists.device).scatter_(1, lists, cols)
            self.inverse[:, PAD_ID] = PAD_ID  # the padding columns hold PAD's id too
        return self.inverse[self.slot[rows], ids]


class SentenceShortlistDecoder:
    """A single model (an :class:`IncrementalDecoder`) whose sentences score only their own
    lists: ``lists`` (N, C) from :meth:`~aiayn.text.shortlist.Shortlist.sentence_rows`, sorted,
    the special ids first, padded with PAD after ``sizes`` (N,); sentence b has list
    b // ``sentences_per_list``. The projection runs in ``dtype`` (default: :func:`shortlist_dtype`)."""

    normalized = False  # logits over the sentence's list; the search takes their log-softmax

    def __init__(self, inner: IncrementalDecoder, lists: Tensor, sizes: Tensor, vocab_size: int,
                 dtype: torch.dtype | None = None, sentences_per_list: int = 1) -> None:
        self.inner = inner
        self.sentences_per_list = sentences_per_list
        self.max_steps = inner.max_steps
        self.vocab_size = vocab_size
        model = inner.model
        weight = model.output_weight  # (V, D), float in every inference copy, int8 ones included
        self.dtype = dtype or shortlist_dtype(weight)
        self.lists = lists
        self.weight = weight.index_select(0, lists.flatten()).to(self.dtype).view(*lists.shape, -1)  # (N, C, D)
        bias = (torch.zeros(lists.shape, dtype=self.dtype, device=lists.device) if model.output_bias is None
                else model.output_bias.index_select(0, lists.flatten()).to(self.dtype).view(lists.shape))
        past_end = torch.arange(lists.size(1), device=lists.device) >= sizes.to(lists.device)[:, None]
        # -inf in bf16 and float32 alike; the search's log-softmax gives these columns -inf
        self.bias = bias.masked_fill(past_end, float("-inf"))

    def init_state(self, src: Tensor, max_steps: int) -> _SentenceRows:
        every = torch.arange(src.size(0), device=src.device)
        state = _SentenceRows(self.inner.init_state(src, max_steps), every // self.sentences_per_list,
                              torch.arange(self.lists.size(0), device=src.device), self.lists, self.weight,
                              self.bias, self.vocab_size)
        return self._lay_out(state)

    def reorder(self, state: _SentenceRows, index: Tensor, same_sources: bool = False) -> _SentenceRows:
        state.inner = self.inner.reorder(state.inner, index, same_sources=same_sources)
        if not same_sources:  # rows may have changed sentences, or sentences left
            state.row_list = state.row_list.index_select(0, index)
            self._lay_out(state)
        return state

    def step(self, tokens: Tensor, state: _SentenceRows, need_attn: bool = False) -> tuple[Tensor, Tensor | None]:
        inner = self.inner
        with inner._precision(tokens.device):
            h, attn = inner.model.decode_step(tokens, state.inner, need_attn, project=False)  # (R, D)
        h = h.to(self.dtype)
        held, cols = state.lists.shape
        weight_t = state.weight.transpose(1, 2)  # (H, D, C)
        if state.pos is None:  # every held list has g rows, in order
            out = torch.baddbmm(state.bias[:, None, :], h.view(held, state.rows_per_list, -1), weight_t)
            return out.view(-1, cols), attn
        assert state.slot is not None
        grouped = h.new_zeros(held, state.rows_per_list, h.size(1))
        grouped[state.slot, state.pos] = h
        out = torch.baddbmm(state.bias[:, None, :], grouped, weight_t)
        return out[state.slot, state.pos], attn

    def step_columns(self, state: _SentenceRows) -> _SentenceRows:
        return state

    def _lay_out(self, state: _SentenceRows) -> _SentenceRows:
        """Set where each row's list is held and the row's place among that list's rows; gather
        the lists and weights again when few of those held are left."""
        live, counts = torch.unique(state.row_list, return_counts=True)
        if live.numel() < REGATHER_BELOW * state.held.numel():
            slots = torch.searchsorted(state.held, live)
            state.held, state.lists = live, state.lists.index_select(0, slots)
            state.weight, state.bias = state.weight.index_select(0, slots), state.bias.index_select(0, slots)
            state.inverse = None
        state.slot = torch.searchsorted(state.held, state.row_list)
        state.rows_per_list = int(counts.max()) if counts.numel() else 1
        rows = state.row_list.numel()
        if live.numel() == state.held.numel() and rows == live.numel() * state.rows_per_list \
                and bool((state.row_list.view(-1, state.rows_per_list) == live[:, None]).all()):
            state.pos = None
            return state
        order = torch.argsort(state.row_list, stable=True)
        starts = torch.cumsum(counts, 0) - counts  # each live list's first place in order
        first = torch.zeros(state.held.numel(), dtype=torch.long, device=live.device)
        first[torch.searchsorted(state.held, live)] = starts
        pos = torch.empty_like(state.row_list)
        pos[order] = torch.arange(rows, device=pos.device) - first[state.slot[order]]
        state.pos = pos
        return state


class ShortlistDecoder:
    """``inner`` (a :class:`~aiayn.inference.search.DecoderModel`) restricted to the target
    ids ``rows`` (sorted, on the decoding device)."""

    def __init__(self, inner: Any, rows: Tensor, vocab_size: int) -> None:
        self.inner = inner
        self.normalized = inner.normalized
        self.max_steps = inner.max_steps
        self.rows = rows
        self.vocab_size = vocab_size
        self._weight: Tensor | None = None
        self._bias: Tensor | None = None
        self._int8: Int8Linear | None = None
        project = getattr(inner, "project", None)
        if type(inner) is IncrementalDecoder and isinstance(project, TransposedProjection):
            self._weight = project.weight_t.index_select(1, rows).contiguous()  # (D, K)
            self._bias = None if project.bias is None else project.bias.index_select(0, rows)
        elif type(inner) is IncrementalDecoder and isinstance(project, Int8Linear):
            model = inner.model  # its output weight stays float in the int8 copy
            bias = None if model.output_bias is None else model.output_bias.index_select(0, rows)
            self._int8 = Int8Linear(model.output_weight.index_select(0, rows), bias, kernel=project.kernel)

    def init_state(self, src: Tensor, max_steps: int) -> Any:
        return self.inner.init_state(src, max_steps)

    def reorder(self, state: Any, index: Tensor, same_sources: bool = False) -> Any:
        return self.inner.reorder(state, index, same_sources=same_sources)

    def step(self, tokens: Tensor, state: Any, need_attn: bool = False) -> tuple[Tensor, Tensor | None]:
        if self._weight is not None or self._int8 is not None:
            inner = self.inner
            with inner._precision(tokens.device):
                h, attn = inner.model.decode_step(tokens, state, need_attn, project=False)
                if self._int8 is not None:
                    scores = self._int8(h)
                else:
                    assert self._weight is not None
                    scores = torch.mm(h, self._weight)
                    if self._bias is not None:
                        scores = scores.add_(self._bias)
        else:
            full, attn = self.inner.step(tokens, state, need_attn)
            scores = full.index_select(1, self.rows)
        if self.normalized:  # log-probabilities: renormalized over the shortlist, as logits are
            scores = torch.log_softmax(scores.float(), dim=-1)
        out = scores.new_full((scores.size(0), self.vocab_size), float("-inf"))
        out.index_copy_(1, self.rows, scores)
        return out, attn


def shortlist_dtype(weight: Tensor) -> torch.dtype:
    """The dtype of a :class:`SentenceShortlistDecoder`'s projection: bfloat16 where its matmuls
    run on dedicated hardware (the weights gathered per list are read at every step, and half
    the bytes is most of the saving), else the output weight's own."""
    return torch.bfloat16 if native_bf16(weight.device) else weight.dtype
