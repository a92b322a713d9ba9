"""Decoding over a vocabulary shortlist (``--shortlist``; the lists: :mod:`aiayn.text.shortlist`).

:class:`ShortlistDecoder` wraps a batch's decoder: each step scores only ``rows`` (the
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

from typing import Any

import torch
from torch import Tensor

from aiayn.inference.adapters import IncrementalDecoder
from aiayn.inference.optimize import TransposedProjection
from aiayn.inference.quantize import Int8Linear


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
