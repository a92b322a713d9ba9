"""A decoding step compiled by ``torch.compile`` (inductor), over a static-shape cache.

:class:`~aiayn.inference.adapters.IncrementalDecoder` attends over the filled prefix of
the key/value cache, whose length grows every step: a compiled graph would be specialised
to each length and recompiled at every step. Here the step attends over the cache's whole
preallocated buffer (``max_len`` positions), the unfilled ones masked, and is told its
position as a tensor: the shapes stay the same from step to step, so one compiled graph
serves the whole search (compiled with dynamic shapes: batch, source and cache lengths
vary between calls). Inductor fuses the step's elementwise work (layer norms, residuals,
int8 input quantization, the softmax) and, with weight *freezing*, treats the weights as
constants it may repack for oneDNN.

The price (measured in docs/benchmarks.md, ``benchmarks/compile_step.py``): each new
family of shapes compiles for tens of seconds on a 2-core CPU, and the frozen weights are
copies beside the model's own. So it is for a long-lived process (``aiayn serve
--compile`` compiles at start-up), or a CLI run on an input large enough to pay it back.

The model is not touched: this module re-states the decoder layer's wiring
(:meth:`aiayn.model.layers.DecoderLayer.step`) over the static cache, calling the
layer's own sub-modules; tests hold the two to the same outputs. Steps that must return
attention weights, and the first step of a search (before beam expansion, with one row
per sentence: a shape family of its own), run the eager step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from aiayn.inference.adapters import IncrementalDecoder
from aiayn.inference.prepare import PreparedModel
from aiayn.model import KVCache, Transformer
from aiayn.model.layers import DecoderLayer

StaticStep = Callable[..., Tensor]
log = logging.getLogger(__name__)

# Asking for the attention weights selects the explicit softmax(QK^T/sqrt(d))V in every
# dtype (the weights themselves are dropped, so inductor never computes them beyond the
# softmax it fuses): the CPU's fused SDPA kernel is slow for a step's one query per row
# (docs/benchmarks.md), and inductor keeps it as an opaque call.
EXPLICIT = True


def static_step(model: Transformer, project: torch.nn.Module) -> StaticStep:
    """``step(tokens (R,), pos (), self_k, self_v, cross_k, cross_v, src_mask) -> logits (R, V)``:
    one decoding step at position ``pos`` over caches given as per-layer lists; writes the
    step's keys/values into ``self_k``/``self_v`` (R, H, max_len, d) at ``pos``."""
    positions = model.tgt_positions
    table = positions.table if positions.kind == "sinusoidal" else positions.learned.weight
    layers: list[DecoderLayer] = list(model.decoder_layers)  # type: ignore[arg-type]

    def step(tokens: Tensor, pos: Tensor, self_k: list[Tensor], self_v: list[Tensor],
             cross_k: list[Tensor], cross_v: list[Tensor], src_mask: Tensor) -> Tensor:
        y = model.tgt_embed(tokens[:, None])  # (R, 1, D)
        y = y + table.index_select(0, pos.view(1)).to(y.dtype)
        filled = (torch.arange(self_k[0].size(2), device=y.device) <= pos).view(1, 1, 1, -1)  # (1, 1, 1, max_len)
        for i, layer in enumerate(layers):
            y = _layer_step(layer, y, pos, filled, self_k[i], self_v[i], cross_k[i], cross_v[i], src_mask)
        if model.decoder_norm is not None:
            y = model.decoder_norm(y)
        return project(y[:, 0])

    return step


def _layer_step(layer: DecoderLayer, y: Tensor, pos: Tensor, filled: Tensor, k_buf: Tensor, v_buf: Tensor,
                cross_k: Tensor, cross_v: Tensor, src_mask: Tensor) -> Tensor:
    rows, groups = y.size(0), cross_k.size(0)

    def self_attn(h: Tensor) -> Tensor:
        q, k, v = layer.self_attn.project_qkv(h)  # (R, H, 1, d)
        k_buf.index_copy_(2, pos.view(1), k)
        v_buf.index_copy_(2, pos.view(1), v)
        return layer.self_attn.attend_heads(q, k_buf, v_buf, mask=filled, need_weights=EXPLICIT)[0]

    def cross(h: Tensor) -> Tensor:
        # A source group's rows are its queries over its one copy of the keys (KVCache.group_size).
        out, _ = layer.cross_attn.attend(h.view(groups, rows // groups, -1), cross_k, cross_v, mask=src_mask,
                                         need_weights=EXPLICIT)
        return out.view(rows, 1, -1)

    y = layer.residual(y, layer.self_attn_norm, self_attn)
    y = layer.residual(y, layer.cross_attn_norm, cross)
    return layer.residual(y, layer.ffn_norm, layer.ffn)


class CompiledDecoder(IncrementalDecoder):
    """:class:`IncrementalDecoder` whose steps run one inductor-compiled graph.

    Compiled lazily, at the first step that can use it: the first call of each new shape
    family (e.g. one sentence against a batch of them) takes tens of seconds. The weights
    are frozen into the graph as they are then: prepare and compile again after changing them.
    """

    def __init__(self, model: Transformer | PreparedModel, autocast: torch.dtype | None = None) -> None:
        super().__init__(model, autocast)
        if self.model.training:
            raise ValueError("CompiledDecoder: put the model in eval mode first (decoding only)")
        self.compiled: StaticStep | None = torch.compile(static_step(self.model, self.project), dynamic=True)

    def step(self, tokens: Tensor, state: KVCache, need_attn: bool = False) -> tuple[Tensor, Tensor | None]:
        if need_attn or state.length == 0 or self.compiled is None:
            return super().step(tokens, state, need_attn)
        if state.length >= state.max_len:
            raise RuntimeError(f"KV cache full: max_len={state.max_len} steps")
        layers = state.layers
        # Freezing is read when a graph compiles, i.e. inside a call; patched for the call
        # alone (torch.compile's options= does not reach it), never set globally.
        try:
            with self._precision(tokens.device), torch._inductor.config.patch(freezing=True):
                logits = self.compiled(tokens, torch.tensor(state.length, device=tokens.device),
                                       [c.self_k for c in layers], [c.self_v for c in layers],
                                       [c.cross_k for c in layers], [c.cross_v for c in layers], state.src_mask)
        except Exception as exc:  # noqa: BLE001 - e.g. no C++ compiler for inductor on this machine
            # At most this step's position was written, and the eager step rewrites it.
            first_line = (str(exc).strip().splitlines() or [""])[0]
            log.warning("compiled decoding is unavailable (%s: %s); decoding eagerly", type(exc).__name__, first_line)
            self.compiled = None
            return super().step(tokens, state, need_attn)
        state.advance()
        return logits, None
