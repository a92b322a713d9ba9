"""The vocabulary a decoding step scores: a shortlist (``--shortlist``; the lists:
:mod:`aiayn.text.shortlist`), given to every step as an argument
(:class:`~aiayn.inference.search.StepVocabulary`).

:class:`SentenceVocabulary` is the fast one, for a single model decoding eagerly: each few
sentences (:data:`SENTENCES_PER_LIST`) score their own list only, and the step returns those
columns, not the vocabulary, so the projection, the log-softmax and the top-k all run over the
list's columns. The projection is one batched matmul of each list's rows (hypotheses) with its
rows of the output weight, gathered once per batch.

:class:`BatchVocabulary` serves the rest (ensembles, compiled steps, constraints, which need
whole-vocabulary scores): each step scores only the batch's shortlist, every other piece gets
a score of -inf, so the search never emits it. A decoder whose projection can be cut to those
rows (:func:`sliced_projection`) runs a (R, D) x (D, K) product instead of (D, V) and
scatters the few hundred or thousand scores into a -inf row of the full vocabulary. With the
float projection (:class:`~aiayn.inference.optimize.TransposedProjection`) its columns are
selected; with the int8 one (:class:`~aiayn.inference.quantize.Int8Linear`) the batch's rows
of the float weight are quantized into a small int8 layer of their own, which gives the same
scores as the full layer (the quantization is per row). Elsewhere (ensembles, compiled steps)
the full step runs and is restricted (:meth:`BatchVocabulary.restrict`): the same outputs, no
saving.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from aiayn.inference.optimize import TransposedProjection
from aiayn.inference.quantize import Int8Linear
from aiayn.model import Transformer
from aiayn.runtime import native_bf16
from aiayn.vocab import PAD_ID

# Sentences that share one list (the union of theirs): one sentence's list is a few hundred
# pieces, but its rows of the output weight, read at every step for a few hypotheses each, make
# the projection memory-bound; a few sentences per list share those reads
# (scripts/bench_shortlist.py measures the choices; docs/results.md has the figures).
SENTENCES_PER_LIST = 4

# The lists' weights are gathered again, for the lists still decoding, when fewer than this
# share of those held are left: the copies stay within a few times the first.
REGATHER_BELOW = 0.75


def sliced_projection(decoder: Any, rows: Tensor) -> torch.nn.Module | None:
    """``decoder``'s vocabulary projection cut to the target ids ``rows``, or None where it
    cannot be cut (the step then scores the whole vocabulary and is restricted)."""
    project, model = decoder.project, decoder.model
    if isinstance(project, TransposedProjection):
        bias = None if project.bias is None else project.bias.index_select(0, rows)
        return _Columns(project.weight_t.index_select(1, rows).contiguous(), bias)  # (D, K)
    if isinstance(project, Int8Linear):
        bias = None if model.output_bias is None else model.output_bias.index_select(0, rows)
        return Int8Linear(model.output_weight.index_select(0, rows), bias, kernel=project.kernel)
    return None


class _Columns(torch.nn.Module):
    """h (R, D) x weight_t (D, K) + bias: a float projection's selected columns."""

    def __init__(self, weight_t: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.weight_t, self.bias = weight_t, bias

    def forward(self, h: Tensor) -> Tensor:
        scores = torch.mm(h, self.weight_t)
        return scores if self.bias is None else scores.add_(self.bias)


class BatchVocabulary:
    """Every row of a batch scores the target ids ``rows`` (sorted, on the decoding device);
    the others get -inf."""

    narrows = False

    def __init__(self, rows: Tensor, vocab_size: int) -> None:
        self.rows = rows
        self.vocab_size = vocab_size
        self._sliced: dict[int, torch.nn.Module | None] = {}  # per decoder: its cut projection

    def start(self, sentences: int) -> None:
        pass

    def select(self, index: Tensor, same_sources: bool = False) -> None:
        pass

    def project(self, h: Tensor, decoder: Any) -> Tensor:
        """The scores of the decoder states ``h`` (R, D) under ``decoder``'s projection (logits)."""
        key = id(decoder)
        if key not in self._sliced:
            self._sliced[key] = sliced_projection(decoder, self.rows)
        sliced = self._sliced[key]
        if sliced is None:
            return self.restrict(decoder.project(h), normalized=False)
        return self._scattered(sliced(h))

    def restrict(self, scores: Tensor, normalized: bool) -> Tensor:
        """Whole-vocabulary scores (R, V) restricted to the rows; log-probabilities
        (``normalized``) are normalized again over them, as logits are by the search."""
        kept = scores.index_select(1, self.rows)
        if normalized:
            kept = torch.log_softmax(kept.float(), dim=-1)
        return self._scattered(kept)

    def _scattered(self, scores: Tensor) -> Tensor:
        out = scores.new_full((scores.size(0), self.vocab_size), float("-inf"))
        return out.index_copy_(1, self.rows, scores)


class SentenceVocabulary:
    """Each few sentences score only their own list: ``lists`` (N, C) from
    :meth:`~aiayn.text.shortlist.Shortlist.sentence_rows`, sorted, the special ids first,
    padded with PAD after ``sizes`` (N,); sentence b has list b // ``sentences_per_list``.
    The projection runs in ``dtype`` (default: :func:`shortlist_dtype`) over ``model``'s
    output weight (float in every inference copy, int8 ones included)."""

    narrows = True

    def __init__(self, model: Transformer, lists: Tensor, sizes: Tensor, vocab_size: int,
                 dtype: torch.dtype | None = None, sentences_per_list: int = 1) -> None:
        self.sentences_per_list = sentences_per_list
        self.vocab_size = vocab_size
        weight = model.output_weight  # (V, D)
        self.dtype = dtype or shortlist_dtype(weight)
        self.all_lists = lists
        self.all_weight = weight.index_select(0, lists.flatten()).to(self.dtype).view(*lists.shape, -1)  # (N, C, D)
        bias = (torch.zeros(lists.shape, dtype=self.dtype, device=lists.device) if model.output_bias is None
                else model.output_bias.index_select(0, lists.flatten()).to(self.dtype).view(lists.shape))
        past_end = torch.arange(lists.size(1), device=lists.device) >= sizes.to(lists.device)[:, None]
        # -inf in bf16 and float32 alike; the search's log-softmax gives these columns -inf
        self.all_bias = bias.masked_fill(past_end, float("-inf"))
        self.start(0)

    def start(self, sentences: int) -> None:
        device = self.all_lists.device
        self.row_list = torch.arange(sentences, device=device) // self.sentences_per_list  # (R,) each row's list
        self.held = torch.arange(self.all_lists.size(0), device=device)  # (H,) the lists held, ascending
        self.lists = self.all_lists  # (H, C) their target ids, PAD after each list's end
        self.weight = self.all_weight  # (H, C, D) their rows of the output weight
        self.bias = self.all_bias  # (H, C) their output bias, -inf after each list's end
        self.slot: Tensor | None = None  # (R,) each row's list's index in held
        self.pos: Tensor | None = None  # (R,) each row's place among its list's rows; None: rows are (H, g)
        self.rows_per_list = 1  # g: the most rows of one list
        self.inverse: Tensor | None = None  # (H, V) the column of each id in each list, once asked for
        if sentences:
            self._lay_out()

    def select(self, index: Tensor, same_sources: bool = False) -> None:
        if not same_sources:  # rows may have changed sentences, or sentences left
            self.row_list = self.row_list.index_select(0, index)
            self._lay_out()

    def project(self, h: Tensor, decoder: Any) -> Tensor:
        """Logits (R, C) of the decoder states ``h`` (R, D) over each row's list."""
        h = h.to(self.dtype)
        held, cols = self.lists.shape
        weight_t = self.weight.transpose(1, 2)  # (H, D, C)
        if self.pos is None:  # every held list has g rows, in order
            out = torch.baddbmm(self.bias[:, None, :], h.view(held, self.rows_per_list, -1), weight_t)
            return out.view(-1, cols)
        assert self.slot is not None
        grouped = h.new_zeros(held, self.rows_per_list, h.size(1))
        grouped[self.slot, self.pos] = h
        out = torch.baddbmm(self.bias[:, None, :], grouped, weight_t)
        return out[self.slot, self.pos]

    def restrict(self, scores: Tensor, normalized: bool) -> Tensor:
        raise ValueError("per-sentence lists need a decoder that projects onto them (a single model, "
                         "decoding eagerly)")

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

    def _lay_out(self) -> None:
        """Set where each row's list is held and the row's place among that list's rows; gather
        the lists and weights again when few of those held are left."""
        live, counts = torch.unique(self.row_list, return_counts=True)
        if live.numel() < REGATHER_BELOW * self.held.numel():
            slots = torch.searchsorted(self.held, live)
            self.held, self.lists = live, self.lists.index_select(0, slots)
            self.weight, self.bias = self.weight.index_select(0, slots), self.bias.index_select(0, slots)
            self.inverse = None
        self.slot = torch.searchsorted(self.held, self.row_list)
        self.rows_per_list = int(counts.max()) if counts.numel() else 1
        rows = self.row_list.numel()
        if live.numel() == self.held.numel() and rows == live.numel() * self.rows_per_list \
                and bool((self.row_list.view(-1, self.rows_per_list) == live[:, None]).all()):
            self.pos = None
            return
        order = torch.argsort(self.row_list, stable=True)
        starts = torch.cumsum(counts, 0) - counts  # each live list's first place in order
        first = torch.zeros(self.held.numel(), dtype=torch.long, device=live.device)
        first[torch.searchsorted(self.held, live)] = starts
        pos = torch.empty_like(self.row_list)
        pos[order] = torch.arange(rows, device=pos.device) - first[self.slot[order]]
        self.pos = pos


def shortlist_dtype(weight: Tensor) -> torch.dtype:
    """The dtype of a :class:`SentenceVocabulary`'s projection: bfloat16 where its matmuls
    run on dedicated hardware (the weights gathered per list are read at every step, and half
    the bytes is most of the saving), else the output weight's own."""
    return torch.bfloat16 if native_bf16(weight.device) else weight.dtype
