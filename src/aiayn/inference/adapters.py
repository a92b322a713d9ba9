"""The Transformer behind the search's :class:`~aiayn.inference.search.DecoderModel` protocol.

:class:`IncrementalDecoder` is the fast one: encoder output and cross-attention
keys/values computed once, self-attention keys/values cached, one position per step.
:class:`RecomputingDecoder` reruns the whole teacher-forced decoder at every step; it is
slow and exists as the reference that the cache is tested against.

Both run a :class:`~aiayn.inference.prepare.PreparedModel` (a plain Transformer given to
them is prepared as it is: same device and dtype) and end each step with its vocabulary
projection, so the two compute the same numbers in every precision, int8 included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.inference.prepare import PreparedModel, prepare_for_inference
from aiayn.model import KVCache, Transformer


def _prepared(model: Transformer | PreparedModel) -> PreparedModel:
    return model if isinstance(model, PreparedModel) else prepare_for_inference(model)


def _max_positions(model: Transformer) -> int | None:
    return getattr(model.tgt_positions, "max_positions", None)


class IncrementalDecoder:
    """Drives :meth:`Transformer.decode_step` with a :class:`KVCache`.

    ``autocast``: run encoder and decoder under ``torch.autocast`` with this dtype (e.g.
    ``torch.bfloat16``); None runs the model in whatever dtype its weights have.
    """

    def __init__(self, model: Transformer | PreparedModel, autocast: torch.dtype | None = None) -> None:
        prepared = _prepared(model)
        self.model = prepared.model
        self.project = prepared.step_projection
        self.autocast = autocast
        self.max_steps = _max_positions(self.model)

    @contextlib.contextmanager
    def _precision(self, device: torch.device) -> Iterator[None]:
        if self.autocast is None:
            yield
        else:
            with torch.autocast(device_type=device.type, dtype=self.autocast):
                yield

    def init_state(self, src: Tensor, max_steps: int) -> KVCache:
        with self._precision(src.device):
            memory, src_mask = self.model.encode(src)
            return self.model.init_cache(memory, src_mask, max_steps)

    def step(self, tokens: Tensor, state: KVCache, need_attn: bool = False) -> tuple[Tensor, Tensor | None]:
        with self._precision(tokens.device):
            h, attn = self.model.decode_step(tokens, state, need_attn, project=False)  # (R, D), (R, L, H, S)
            return self.project(h), attn  # (R, V)

    def reorder(self, state: KVCache, index: Tensor, same_sources: bool = False) -> KVCache:
        state.reorder(index, same_sources=same_sources)
        return state


@dataclass
class _FullState:
    memory: Tensor  # (R, S, D)
    src_mask: Tensor  # (R, 1, 1, S)
    tokens: Tensor  # (R, t+1): BOS and everything fed so far


class RecomputingDecoder:
    """Reruns :meth:`Transformer.decode` over the whole prefix each step (no cache)."""

    def __init__(self, model: Transformer | PreparedModel) -> None:
        prepared = _prepared(model)
        self.model = prepared.model
        self.project = prepared.step_projection
        self.max_steps = _max_positions(self.model)

    def init_state(self, src: Tensor, max_steps: int) -> _FullState:
        memory, src_mask = self.model.encode(src)
        return _FullState(memory, src_mask, torch.empty(src.size(0), 0, dtype=torch.long,
                                                        device=src.device))

    def step(self, tokens: Tensor, state: _FullState, need_attn: bool = False) -> tuple[Tensor, Tensor | None]:
        state.tokens = torch.cat([state.tokens, tokens[:, None]], dim=1)
        h, attn = self.model.decode(state.tokens, state.memory, state.src_mask, need_attn, project=False)
        # h (R, T, D); attn (R, L, H, T, S): keep the last position.
        return self.project(h[:, -1]), (attn[:, :, :, -1] if attn is not None else None)

    def reorder(self, state: _FullState, index: Tensor, same_sources: bool = False) -> _FullState:
        return _FullState(state.memory.index_select(0, index), state.src_mask.index_select(0, index),
                          state.tokens.index_select(0, index))
