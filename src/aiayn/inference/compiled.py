"""A decoding step compiled ahead of time (AOTInductor), over a cache of symbolic shape.

:class:`~aiayn.inference.adapters.IncrementalDecoder` attends over the filled prefix of
the key/value cache, whose length grows every step: a compiled graph would be specialised
to each length. Here the step attends over the cache's whole buffer (16 positions at first,
doubled when full), the unfilled ones masked, and is told its position as a tensor: one
compiled step serves the whole search (the sizes that vary between calls -- rows, source
groups and lengths, buffer positions -- are symbolic; heads and widths are constants).
Inductor fuses the step's elementwise work (layer norms, residuals, int8 input
quantization, the softmax) and, with the weights *frozen* in, treats them as constants it
may repack for oneDNN. The compiled step is kept
on disk as a package, keyed by the weights (:mod:`aiayn.inference.step_packages`): a later
run with the same model loads it instead of building it.

Beam search's reorders copy nothing here (:class:`IndexedKVCache`): a key/value stays in
the buffer row that wrote it, a table says which row holds each hypothesis's at each
position, and the step's self-attention reads through that table, a gather inductor fuses
into the attention's loads.

The price (``benchmarks/compile_step.py`` measures it; docs/results.md has the figures):
building a package costs far more than loading one, and the frozen weights are copies beside
the model's own. So
compiling is for a long-lived process (``aiayn serve``), an input large enough to pay the
build back, or a model whose package an earlier run built.

The model is not touched: this module re-states the decoder layer's wiring
(:meth:`aiayn.model.layers.DecoderLayer.step`) over the static cache, calling the
layer's own sub-modules; tests hold the two to the same outputs. Steps that must return
attention weights, the first step of a search (before beam expansion, with one row per
sentence), and steps over a one-token source (a size torch specialises) run the eager step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, cast

import torch
from torch import Tensor

from aiayn.inference.adapters import IncrementalDecoder
from aiayn.inference.optimize import OptimizedModel
from aiayn.inference.search import StepVocabulary, step_log_probs
from aiayn.inference.step_packages import StepPackages, exportable
from aiayn.model import KVCache, Transformer
from aiayn.model.cache import LayerCache
from aiayn.model.layers import DecoderLayer

StaticStep = Callable[..., Tensor]
log = logging.getLogger(__name__)

# `--compile auto`'s estimate (compile_pays). Compiling costs a warm-up before the first
# compiled step: COMPILE_WARMUP_S to build the step's packages, CACHED_COMPILE_WARMUP_S to check
# the weights and load the ones an earlier run built (step_packages); both are estimates for a
# small CPU, re-measured by benchmarks/compile_step.py.
# Afterwards each line runs faster: by SAVED_S_PER_LINE (the eager step's per-step work the
# compiled one does not do: cache copies on reorders, separate elementwise passes) plus the
# model's parameters times SAVED_S_PER_LINE_PER_PARAMETER (fitted to the int8 eager and
# compiled decoding of the Multi30k recipe's model, 7.6M parameters, and of the base model,
# docs/results.md, at Multi30k's sentence lengths). Only the CPU path is estimated;
# elsewhere `auto` decodes eagerly.
COMPILE_WARMUP_S = {"cpu": 50.0}
CACHED_COMPILE_WARMUP_S = {"cpu": 1.0}
SAVED_S_PER_LINE = 8e-4
SAVED_S_PER_LINE_PER_PARAMETER = 6e-11
# Never compile for fewer lines than this, whatever the estimate says.
MIN_COMPILE_LINES = 1000
# Nor a model smaller than this: the gain was measured down to the Multi30k recipe's model.
MIN_COMPILE_PARAMETERS = 5_000_000


def compile_pays(lines: int | None, parameters: int, device: torch.device | str, warm: bool = False) -> bool:
    """Whether compiling the decoding steps of a model with ``parameters`` parameters on
    ``device`` is estimated to save more time over ``lines`` lines than its warm-up costs
    (``warm``: an earlier run built the compiled steps of these weights). None lines (a
    stream of unknown length) and devices without an estimate: no."""
    kind = torch.device(device).type
    if lines is None or lines < MIN_COMPILE_LINES or kind not in COMPILE_WARMUP_S:
        return False
    if parameters < MIN_COMPILE_PARAMETERS:
        return False
    warmup = (CACHED_COMPILE_WARMUP_S if warm else COMPILE_WARMUP_S)[kind]
    return lines * (SAVED_S_PER_LINE + parameters * SAVED_S_PER_LINE_PER_PARAMETER) > warmup

# Asking for the attention weights selects the explicit softmax(QK^T/sqrt(d))V in every
# dtype (the weights themselves are dropped, so inductor never computes them beyond the
# softmax it fuses): the CPU's fused SDPA kernel is slow for a step's one query per row,
# and inductor keeps it as an opaque call.
EXPLICIT = True


def static_step(model: Transformer, project: torch.nn.Module, fused: bool = True) -> StaticStep:
    """``step(tokens (R,), pos (), rows, self_k, self_v, cross_k, cross_v, src_mask) -> log-probabilities
    (R, V)``, float32 (the log-softmax fused into the step: one pass over the vocabulary instead of
    the search's three): one decoding step at position ``pos`` over caches given as per-layer lists; writes the
    step's keys/values into the first R rows of ``self_k``/``self_v`` (>= R, H, P, d; P
    positions) at ``pos``, and reads hypothesis i's at position t from row ``rows[t, i]`` (P, R).

    ``fused``: self-attention written for a compiler that fuses the cache's gather into its
    loads (the AOTInductor packages); else with batched matrix products, for a step whose
    operations run as they are written (a CUDA graph replays eager kernels), where the fused
    form would materialise float32 copies of every gathered key and value."""
    positions = model.tgt_positions
    table = positions.table if positions.kind == "sinusoidal" else positions.learned.weight
    layers: list[DecoderLayer] = list(model.decoder_layers)  # type: ignore[arg-type]

    def step(tokens: Tensor, pos: Tensor, rows: Tensor, self_k: list[Tensor], self_v: list[Tensor],
             cross_k: list[Tensor], cross_v: list[Tensor], src_mask: Tensor) -> Tensor:
        y = model.tgt_embed(tokens[:, None])  # (R, 1, D)
        y = y + table.index_select(0, pos.view(1)).to(y.dtype)
        lineage = _Lineage(rows, pos, fused)
        for i, layer in enumerate(layers):
            y = _layer_step(layer, y, lineage, _LayerBuffers(self_k[i], self_v[i], cross_k[i], cross_v[i]), src_mask)
        if model.decoder_norm is not None:
            y = model.decoder_norm(y)
        return torch.log_softmax(project(y[:, 0]).float(), dim=-1)

    return step


class _Lineage(NamedTuple):
    """Where a step reads the self-attention cache: hypothesis i's key/value at position t is
    in buffer row ``rows[t, i]`` (P, R); positions after ``pos`` are masked. ``fused``: see
    :func:`static_step`."""

    rows: Tensor
    pos: Tensor
    fused: bool = True

    def attend(self, q: Tensor, k_buf: Tensor, v_buf: Tensor) -> Tensor:
        """softmax(q K^T / sqrt(d_k)) V for one query per row, q (R, H, 1, d_k) -> (R, H, d_v),
        with K and V gathered through ``rows``. Fused: as products and sums (not two batched
        matmuls), so that inductor fuses the gather into the loads, in float32 whatever the
        cache's dtype (inductor widens the loads in place)."""
        t = torch.arange(self.rows.size(0), device=q.device)
        k = k_buf[self.rows.t(), :, t].transpose(1, 2)  # (R, H, P, d_k)
        v = v_buf[self.rows.t(), :, t].transpose(1, 2)  # (R, H, P, d_v)
        if not self.fused:
            scores = torch.matmul(q, k.transpose(-1, -2)).float() / math.sqrt(q.size(-1))  # (R, H, 1, P)
            probs = torch.softmax(scores.masked_fill(t > self.pos, float("-inf")), dim=-1)
            return torch.matmul(probs.to(v.dtype), v)[:, :, 0]
        scores = (q.float() * k.float()).sum(-1) / math.sqrt(q.size(-1))  # (R, H, P)
        scores = scores.masked_fill(t > self.pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return (probs.unsqueeze(-1) * v.float()).sum(2).to(v.dtype)


class _LayerBuffers(NamedTuple):
    """One decoder layer's caches: self-attention key/value buffers and cross-attention keys/values."""

    k: Tensor
    v: Tensor
    cross_k: Tensor
    cross_v: Tensor


def _layer_step(layer: DecoderLayer, y: Tensor, lineage: _Lineage, buffers: _LayerBuffers, src_mask: Tensor) -> Tensor:
    k_buf, v_buf, cross_k, cross_v = buffers
    rows, groups = y.size(0), cross_k.size(0)

    def self_attn(h: Tensor) -> Tensor:
        q, k, v = layer.self_attn.project_qkv(h)  # (R, H, 1, d)
        # Into the first R rows (the buffers may hold more), by indexing the whole buffer:
        # a write into a slice made inductor copy the whole buffer around it.
        at = (torch.arange(rows, device=y.device), slice(None), lineage.pos.view(1))
        k_buf[at] = k[:, :, 0]
        v_buf[at] = v[:, :, 0]
        out = lineage.attend(q, k_buf, v_buf)  # (R, H, d_v)
        return layer.self_attn.w_o(out.reshape(rows, 1, -1))

    def cross(h: Tensor) -> Tensor:
        # A source group's rows are its queries over its one copy of the keys (KVCache.group_size).
        out, _ = layer.cross_attn.attend(h.view(groups, rows // groups, -1), cross_k, cross_v, mask=src_mask,
                                         need_weights=EXPLICIT)
        return out.view(rows, 1, -1)

    y = layer.residual(y, layer.self_attn_norm, self_attn)
    y = layer.residual(y, layer.cross_attn_norm, cross)
    return layer.residual(y, layer.ffn_norm, layer.ffn)


class IndexedKVCache(KVCache):
    """A :class:`KVCache` whose self-attention keys/values stay in the row that wrote them.

    A beam reorder of :class:`KVCache` copies every filled key and value of every layer to
    follow the new rows: work that grows with the prefix, at every step. Here a reorder
    only updates ``rows`` (P, R): hypothesis i's key/value at position t sits in
    buffer row ``rows[t, i]``, and the compiled step reads through it. The buffers keep
    their rows when sentences finish (a finished row may hold a survivor's ancestors) and
    are gathered for real only when the rows outgrow them (beam expansion) and before an
    eager step (:meth:`materialize`).
    """

    def __init__(self, cache: KVCache) -> None:
        super().__init__(cache.layers, cache.src_mask, cache.max_len, cache.group_size)
        for c in self.layers:
            # The layout a regrouping (index_select) gives them: a package reads them with the strides
            # of the example it was built from.
            c.cross_k, c.cross_v = c.cross_k.contiguous(), c.cross_v.contiguous()
        self.length = cache.length
        self.rows = self._identity(cache.batch_size)
        self.moved = False  # rows differs from the identity

    def _identity(self, n: int, positions: int | None = None) -> Tensor:
        positions = self.positions if positions is None else positions
        return torch.arange(n, device=self.src_mask.device).repeat(positions, 1)  # (positions, n)

    @property
    def positions(self) -> int:
        """Positions the self-attention buffers hold (the compiled step attends over all of them)."""
        return self.layers[0].self_k.size(2) if self.layers else self.max_len

    def make_room(self) -> None:
        """Before a compiled step: room for its position (the buffers doubled when full, up to
        ``max_len``: attending over all of them costs less than over ``max_len`` from the
        start)."""
        self.check_room()
        if self.length >= self.positions:
            self.reserve(2 * self.positions)
        assert self.length < self.positions, "the compiled step writes one position past the filled ones"

    def _grow(self, c: LayerCache, positions: int) -> None:
        """Every growth of the buffers (here, or in an eager step's append) grows the ``rows``
        table with them."""
        super()._grow(c, positions)
        missing = self.positions - self.rows.size(0)
        if missing > 0:
            self.rows = torch.cat([self.rows, self._identity(self.batch_size, missing)])

    @property
    def batch_size(self) -> int:
        return self.rows.size(1)

    def _reorder_self(self, index: Tensor) -> None:
        if self.layers and index.numel() > self.layers[0].self_k.size(0):  # more rows than buffer rows
            self.materialize()
            super()._reorder_self(index)
            self.rows = self._identity(index.numel())
            return
        rows = self._identity(index.numel())
        rows[:self.length] = self.rows[:self.length].index_select(1, index)
        self.rows, self.moved = rows, True

    def materialize(self) -> None:
        """Gather each hypothesis's keys/values into its own row, as :class:`KVCache` keeps them."""
        if not self.moved:
            return
        n, r = self.length, self.batch_size
        where = (self.rows[:n].t(), slice(None), torch.arange(n, device=self.rows.device))
        for c in self.layers:
            c.self_k, c.spare_k = _placed(c.self_k, c.spare_k, where, r), c.self_k
            c.self_v, c.spare_v = _placed(c.self_v, c.spare_v, where, r), c.self_v
        self.rows, self.moved = self._identity(r), False


def _placed(buf: Tensor, spare: Tensor | None, where: tuple[Tensor, slice, Tensor], rows: int) -> Tensor:
    """The filled positions of ``buf`` gathered through ``where`` into ``rows`` rows of the
    spare buffer, as :meth:`KVCache._gather` writes a reorder."""
    out = KVCache._target(buf, spare, rows)
    out[:, :, :where[2].numel()] = buf[where].transpose(1, 2)
    return out


class CompiledDecoder(IncrementalDecoder):
    """:class:`IncrementalDecoder` whose steps run a compiled step: an AOTInductor package
    (:mod:`aiayn.inference.step_packages`), loaded from the compile cache when an earlier run
    built it for these weights, else exported and compiled at the first step that can use it
    (:data:`COMPILE_WARMUP_S`). The weights are frozen into the package as they are
    then: optimize and compile again after changing them. Its steps return log-probabilities.
    """

    normalized = True
    projects_sentence_lists = False  # its steps score the whole vocabulary; a shortlist restricts them

    def __init__(self, model: Transformer | OptimizedModel, folder: Path | None = None) -> None:
        super().__init__(model)
        if self.model.training:
            raise ValueError("CompiledDecoder: put the model in eval mode first (decoding only)")
        twin = cast(Transformer, exportable(self.model))
        project = exportable(self.project)
        parts = [twin.tgt_embed, twin.tgt_positions, twin.decoder_layers, project]
        if twin.decoder_norm is not None:
            parts.append(twin.decoder_norm)
        self.packages = StepPackages(static_step(twin, project), parts, folder=folder)
        self.compiled: StaticStep | None = self.packages
        self.compiled_ran = False  # a compiled step has run (its package is built or loaded)

    def init_state(self, src: Tensor, max_steps: int) -> IndexedKVCache:
        return IndexedKVCache(super().init_state(src, max_steps))

    def step(self, tokens: Tensor, state: KVCache, need_attn: bool = False,
             vocabulary: StepVocabulary | None = None) -> tuple[Tensor, Tensor | None]:
        log_probs, attn = self._step(tokens, state, need_attn)
        if vocabulary is not None:
            log_probs = vocabulary.restrict(log_probs, normalized=True)
        return log_probs, attn

    def _step(self, tokens: Tensor, state: KVCache, need_attn: bool) -> tuple[Tensor, Tensor | None]:
        """The step's log-probabilities over the whole vocabulary: compiled where it can run."""
        assert isinstance(state, IndexedKVCache), "a CompiledDecoder decodes over its own init_state"
        if need_attn or state.length == 0 or self.compiled is None:
            return self._eager_step(tokens, state, need_attn)
        state.make_room()
        layers = state.layers
        args = (tokens, torch.tensor(state.length, device=tokens.device), state.rows,
                [c.self_k for c in layers], [c.self_v for c in layers],
                [c.cross_k for c in layers], [c.cross_v for c in layers], state.src_mask)
        if not StepPackages.fits(args):
            return self._eager_step(tokens, state, need_attn)
        try:
            logits = self.compiled(*args)
        except Exception as exc:  # noqa: BLE001 - e.g. no C++ compiler for inductor on this machine
            # At most this step's position was written, and the eager step rewrites it.
            first_line = (str(exc).strip().splitlines() or [""])[0]
            log.warning("compiled decoding is unavailable (%s: %s); decoding eagerly", type(exc).__name__, first_line)
            self.compiled = None
            return self._eager_step(tokens, state, need_attn)
        self.compiled_ran = True
        state.advance()
        return logits, None

    def _eager_step(self, tokens: Tensor, state: IndexedKVCache, need_attn: bool) -> tuple[Tensor, Tensor | None]:
        state.materialize()
        logits, attn = super().step(tokens, state, need_attn)
        return step_log_probs(logits, normalized=False), attn
