"""Decoding steps replayed as CUDA graphs, one per (batch bucket, beam), over a static cache.

On a GPU an eager decoding step is launch-bound: hundreds of small kernels, each waiting on
the host to launch it, for a few rows of work. A CUDA graph records the step's kernels once
and replays them with one launch. A graph replays on the very memory it was recorded on, so
everything the step reads lives in static buffers here:

- the self-attention keys/values: the search's cache is *bound* to a pool of buffers
  (:class:`_Pool`) with room for every position of the search from the start
  (:class:`StaticKVCache`), and the step writes into them in place; beam reorders only
  update the table of rows (:class:`~aiayn.inference.compiled.IndexedKVCache`);
- the step's small inputs (tokens, position, the rows table) and the cross-attention
  keys/values and source mask, copied into each graph's slots before it replays (the cross
  keys only when the search has regrouped them).

Shapes are bucketed so that a few graphs serve every batch: source groups (sentences) go up
to the next bucket (:func:`bucket_rows`) and source lengths up to a multiple of
:data:`SOURCE_MULTIPLE`. Padding rows decode a token of their own over finite buffers and
padding source positions are masked, so the real rows' outputs are the unpadded step's.
A graph is keyed by :class:`GraphKey` and reused by every later step and search with the same
key. The step itself is :func:`aiayn.inference.compiled.static_step`, run by the model's own
modules (tests hold it to the eager step).

Recording goes through a :data:`Capture` function: :func:`cuda_capture`
(``torch.cuda.CUDAGraph``) on a GPU; tests on a CPU give one that replays the step
eagerly on the same static buffers, which checks everything here but the recording. When
recording fails the decoder warns once and decodes eagerly from then on.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

from aiayn.inference.adapters import IncrementalDecoder
from aiayn.inference.compiled import CompiledDecoder, IndexedKVCache, StaticStep, static_step
from aiayn.inference.optimize import OptimizedModel
from aiayn.model import KVCache, Transformer

log = logging.getLogger(__name__)

# (record: run the step once, returning its output) -> (the output tensor, a replay that
# rewrites that tensor in place from the current contents of the static inputs). Recording
# need not compute anything (a CUDA graph's launches nothing): the step replays after it.
Capture = Callable[[Callable[[], Tensor]], tuple[Tensor, Callable[[], None]]]

SOURCE_MULTIPLE = 16  # source lengths are padded up to a multiple of this
MIN_POSITIONS = 16  # the static cache's positions: a power of two, at least this
# Rows up to this many source groups are bucketed to the next power of two; beyond it, to a
# multiple of it (a batch shrinking as its sentences finish records a graph per bucket it passes).
POWER_OF_TWO_UP_TO = 64
WARMUP_RUNS = 2  # eager runs on a side stream before recording (cuBLAS picks its kernels there)
# Steps of more rows (bucketed) run eagerly: the graph's step reads the self-attention cache
# through the rows table over every position of the static buffers, a gather that outgrows the
# launches a graph saves once there are enough rows to keep the GPU busy (docs/results.md, "One
# GPU": graphs 1.2x the eager steps at 256 rows, 0.5x at 2,048).
MAX_GRAPH_ROWS = 256
# `--compile auto` on a GPU: recording a graph runs the step a few times and compiles
# nothing, so any input but a handful of lines pays.
MIN_GRAPH_LINES = 8


def uses_cuda_graphs(device: torch.device | str) -> bool:
    """Whether compiled decoding on ``device`` replays CUDA graphs (else: the CPU's
    AOTInductor packages, :mod:`aiayn.inference.compiled`). The one place that decides it."""
    return torch.device(device).type == "cuda"


def graphs_pay(lines: int | None) -> bool:
    """`--compile auto` on a GPU: whether ``lines`` lines are worth recording graphs for (None,
    a stream of unknown length: no, as on a CPU)."""
    return lines is not None and lines >= MIN_GRAPH_LINES


def bucket_rows(n: int) -> int:
    """The bucket of ``n`` (>= 1) source groups or buffer rows: the next power of two up to
    :data:`POWER_OF_TWO_UP_TO`, beyond it the next multiple of it."""
    if n < 1:
        raise ValueError(f"bucket_rows: {n} rows")
    if n <= POWER_OF_TWO_UP_TO:
        return 1 << (n - 1).bit_length()
    return -(-n // POWER_OF_TWO_UP_TO) * POWER_OF_TWO_UP_TO


def bucket_source(length: int) -> int:
    """A source length padded up to a multiple of :data:`SOURCE_MULTIPLE`."""
    return max(SOURCE_MULTIPLE, -(-length // SOURCE_MULTIPLE) * SOURCE_MULTIPLE)


def bucket_positions(max_len: int) -> int:
    """The static cache's positions for a search of ``max_len`` steps: a power of two."""
    return max(MIN_POSITIONS, 1 << (max_len - 1).bit_length())


class GraphKey(NamedTuple):
    """What a recorded step is specialised to."""

    groups: int  # source groups (sentences), bucketed
    per_source: int  # rows per source group (the beam)
    buffer_rows: int  # rows of the static self-attention buffers
    positions: int  # positions of the static cache
    source: int  # source length, bucketed
    dtype: torch.dtype  # the cache's

    @property
    def rows(self) -> int:
        return self.groups * self.per_source


class StaticKVCache(IndexedKVCache):
    """An :class:`IndexedKVCache` whose self-attention buffers hold every position of the
    search from the start (:func:`bucket_positions`): they never grow, so a graph recorded
    on them stays valid for the whole search."""

    def __init__(self, cache: KVCache) -> None:
        super().__init__(cache)
        positions = bucket_positions(self.max_len)
        for c in self.layers:
            c.self_k = c.self_k.new_zeros(c.self_k.shape[:2] + (positions,) + c.self_k.shape[3:])
            c.self_v = c.self_v.new_zeros(c.self_v.shape[:2] + (positions,) + c.self_v.shape[3:])
            c.spare_k = c.spare_v = None
        self.rows = self._identity(self.batch_size, positions)
        self.pool: _Pool | None = None  # the pool its buffers are bound to


@dataclass(eq=False)
class _Pool:
    """Static self-attention buffers, lent to one search (cache) at a time."""

    self_k: list[Tensor]
    self_v: list[Tensor]
    owner: weakref.ref[StaticKVCache] | None = None

    def busy_for(self, state: StaticKVCache) -> bool:
        holder = self.owner() if self.owner is not None else None
        return holder is not None and holder is not state


@dataclass(eq=False)
class _Graph:
    """One recorded step: its static inputs and output, and how to replay it."""

    tokens: Tensor  # (rows,)
    pos: Tensor  # ()
    rows: Tensor  # (positions, rows)
    cross_k: list[Tensor]  # (groups, H, source, d)
    cross_v: list[Tensor]
    src_mask: Tensor  # (groups, 1, 1, source)
    pool: _Pool
    out: Tensor | None = None  # (rows, V) log-probabilities, rewritten by every replay
    replay: Callable[[], None] | None = None
    copied: tuple[object, ...] = field(default=())  # what the cross slots hold (see _same_sources)


def cuda_capture() -> Capture:
    """A :data:`Capture` recording into ``torch.cuda.CUDAGraph`` objects, after warm-up runs on
    a side stream (as torch's documentation prescribes). Its graphs share one memory pool: they
    replay one at a time, and each output is copied out before another graph replays."""
    pool: list[Any] = []  # the memory pool's handle, taken at the first recording

    def capture(record: Callable[[], Tensor]) -> tuple[Tensor, Callable[[], None]]:
        if not pool:
            pool.append(torch.cuda.graph_pool_handle())
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                record()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a server's other threads go on launching work while a graph records.
        with torch.cuda.graph(graph, pool=pool[0], capture_error_mode="thread_local"):
            out = record()
        return out, graph.replay

    return capture


class CudaGraphSteps:
    """The decoding step ``step`` (:func:`~aiayn.inference.compiled.static_step`) replayed
    from recorded graphs, one per :class:`GraphKey`."""

    def __init__(self, step: StaticStep, capture: Capture | None = None) -> None:
        self.step = step
        self.capture = capture if capture is not None else cuda_capture()
        self.max_rows = MAX_GRAPH_ROWS
        self.graphs: dict[GraphKey, _Graph] = {}
        self.pools: dict[tuple[int, int, torch.dtype], _Pool] = {}
        self.captured: list[GraphKey] = []  # in the order they were recorded
        self.replays = 0

    def key(self, state: StaticKVCache, rows: int) -> GraphKey:
        """The graph a step of ``rows`` rows over ``state`` replays."""
        groups = state.src_mask.size(0)
        per_source = rows // groups
        groups_bucket = bucket_rows(groups)
        first = state.layers[0]
        if state.pool is not None:  # bound already (an eager step may have replaced the buffers since)
            buffer_rows = state.pool.self_k[0].size(0)
        else:  # room for the bucket's rows and every row the cache's table may point to
            buffer_rows = bucket_rows(max(first.self_k.size(0), groups_bucket * per_source))
        return GraphKey(groups_bucket, per_source, buffer_rows, state.positions,
                        bucket_source(first.cross_k.size(2)), first.self_k.dtype)

    def fits(self, state: StaticKVCache, rows: int) -> bool:
        """Whether a graph can run this step (else: the eager step). The cache must be a
        :class:`StaticKVCache` with its rows in equal groups (beam search keeps them so), the
        step at most ``max_rows`` rows once bucketed, and no other search's cache holding the
        buffers it would be bound to."""
        if not isinstance(state, StaticKVCache) or not state.layers:
            return False
        groups = state.src_mask.size(0)
        if rows % groups or rows // groups != state.group_size:
            return False
        key = self.key(state, rows)
        if key.rows > min(key.buffer_rows, self.max_rows):
            return False
        pool = self.pools.get((key.buffer_rows, key.positions, key.dtype))
        return pool is None or not pool.busy_for(state)

    def __call__(self, tokens: Tensor, state: StaticKVCache) -> Tensor:
        """Log-probabilities (R, V), float32, of one step at position ``state.length`` (the
        caller advances it), as :func:`~aiayn.inference.compiled.static_step` computes them."""
        rows = tokens.size(0)
        key = self.key(state, rows)
        self._bind(state, key)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = self._slots(key, state)
        self._fill(graph, tokens, state)
        if graph.replay is None:
            graph.out, graph.replay = self.capture(lambda: self._run(graph))
            self.captured.append(key)
        graph.replay()
        self.replays += 1
        assert graph.out is not None
        return graph.out[:rows].clone()

    def _run(self, g: _Graph) -> Tensor:
        return self.step(g.tokens, g.pos, g.rows, g.pool.self_k, g.pool.self_v, g.cross_k, g.cross_v, g.src_mask)

    def _bind(self, state: StaticKVCache, key: GraphKey) -> None:
        """Make ``state``'s self-attention buffers the pool's (copying what they hold the first
        time, and after an eager step replaced them)."""
        pool_key = (key.buffer_rows, key.positions, key.dtype)
        pool = self.pools.get(pool_key)
        if pool is None:
            first = state.layers[0]
            shape = (key.buffer_rows,) + first.self_k.shape[1:]
            with _plain_tensors():
                pool = self.pools[pool_key] = _Pool(
                    [first.self_k.new_zeros(shape) for _ in state.layers],
                    [first.self_v.new_zeros((key.buffer_rows,) + first.self_v.shape[1:]) for _ in state.layers])
        for i, c in enumerate(state.layers):
            for name, spare in (("self_k", "spare_k"), ("self_v", "spare_v")):
                buf, static = getattr(c, name), getattr(pool, name)[i]
                if buf is not static:
                    static[:buf.size(0)].copy_(buf)
                    setattr(c, name, static)
                    setattr(c, spare, None)
        state.pool = pool
        pool.owner = weakref.ref(state)
        # The buffers may now have more rows than the search: an eager step gathers its rows first.
        state.moved = True

    def _slots(self, key: GraphKey, state: StaticKVCache) -> _Graph:
        pool = self.pools[(key.buffer_rows, key.positions, key.dtype)]
        first = state.layers[0]
        device = first.self_k.device
        cross = (key.groups, first.cross_k.size(1), key.source)
        with _plain_tensors():
            return _Graph(
                tokens=torch.zeros(key.rows, dtype=torch.long, device=device),
                pos=torch.zeros((), dtype=torch.long, device=device),
                # Padding rows read their own buffer rows: finite values, whatever they hold.
                rows=torch.arange(key.rows, device=device).repeat(key.positions, 1),
                cross_k=[first.cross_k.new_zeros(cross + (first.cross_k.size(3),)) for _ in state.layers],
                cross_v=[first.cross_v.new_zeros(cross + (first.cross_v.size(3),)) for _ in state.layers],
                # Padding groups attend over every (finite) position: no all-masked softmax.
                src_mask=torch.ones((key.groups, 1, 1, key.source), dtype=torch.bool, device=device),
                pool=pool)

    def _fill(self, g: _Graph, tokens: Tensor, state: StaticKVCache) -> None:
        rows = tokens.size(0)
        g.tokens[:rows].copy_(tokens)
        g.pos.fill_(state.length)
        g.rows[:, :rows].copy_(state.rows)
        if _same_sources(g.copied, state):  # the same tensors, unchanged since they were copied
            return
        groups, length = state.src_mask.size(0), state.layers[0].cross_k.size(2)
        for slot_k, slot_v, c in zip(g.cross_k, g.cross_v, state.layers):
            slot_k[:groups, :, :length].copy_(c.cross_k)
            slot_v[:groups, :, :length].copy_(c.cross_v)
        g.src_mask[:groups].fill_(False)
        g.src_mask[:groups, ..., :length].copy_(state.src_mask)
        g.src_mask[groups:].fill_(True)
        g.copied = tuple((weakref.ref(t), _version(t)) for t in _source_tensors(state))


def _source_tensors(state: KVCache) -> list[Tensor]:
    return [state.src_mask] + [t for c in state.layers for t in (c.cross_k, c.cross_v)]


def _version(t: Tensor) -> int | None:
    """The tensor's version counter (None for one made under inference mode, which has none:
    the cache never writes into its cross-attention tensors in place, it replaces them)."""
    return None if t.is_inference() else t._version


def _same_sources(copied: tuple[object, ...], state: KVCache) -> bool:
    """Whether ``copied`` (weak references to the tensors last copied, with their version
    counters: a freed tensor's memory may be reused by another) names the cross-attention
    keys/values and mask ``state`` holds now, unchanged."""
    tensors = _source_tensors(state)
    if len(copied) != len(tensors):
        return False
    for entry, t in zip(copied, tensors):
        ref, version = cast(tuple[weakref.ref[Tensor], int | None], entry)
        if ref() is not t or version != _version(t):
            return False
    return True


@contextlib.contextmanager
def _plain_tensors() -> Iterator[None]:
    """Static buffers are ordinary tensors even when made under ``torch.inference_mode``, so
    that a later search outside it may still write into them."""
    with torch.inference_mode(False), torch.no_grad():
        yield


class CudaGraphDecoder(CompiledDecoder):
    """:class:`~aiayn.inference.compiled.CompiledDecoder` whose compiled steps are CUDA graphs
    (:class:`CudaGraphSteps`) over a :class:`StaticKVCache`: nothing is built ahead of time,
    a graph is recorded the first time its :class:`GraphKey` comes up and kept
    for the decoder's life. Steps that need attention weights, the first step of a search and
    rows not in equal groups run eagerly; so does every step after a recording failed
    (with one warning). Its steps return log-probabilities."""

    def __init__(self, model: Transformer | OptimizedModel, capture: Capture | None = None) -> None:
        # The AOTInductor packages of CompiledDecoder are not built: only its step logic is shared.
        IncrementalDecoder.__init__(self, model)
        if self.model.training:
            raise ValueError("CudaGraphDecoder: put the model in eval mode first (decoding only)")
        self.graphs = CudaGraphSteps(static_step(self.model, self.project, fused=False), capture)
        self.compiled: CudaGraphSteps | None = self.graphs
        self.compiled_ran = False

    def init_state(self, src: Tensor, max_steps: int) -> StaticKVCache:
        return StaticKVCache(IncrementalDecoder.init_state(self, src, max_steps))

    def _step(self, tokens: Tensor, state: KVCache, need_attn: bool) -> tuple[Tensor, Tensor | None]:
        assert isinstance(state, IndexedKVCache), "a CudaGraphDecoder decodes over its own init_state"
        graphs = self.compiled
        if (need_attn or state.length == 0 or graphs is None or not isinstance(state, StaticKVCache)
                or not graphs.fits(state, tokens.size(0))):
            return self._eager_step(tokens, state, need_attn)
        state.check_room()
        try:
            log_probs = graphs(tokens, state)
        except Exception as exc:  # noqa: BLE001 - e.g. an operation that cannot be recorded
            # At most this step's position was written, and the eager step rewrites it.
            first_line = (str(exc).strip().splitlines() or [""])[0]
            log.warning("CUDA graph decoding is unavailable (%s: %s); decoding eagerly", type(exc).__name__,
                        first_line)
            self.compiled = None
            return self._eager_step(tokens, state, need_attn)
        self.compiled_ran = True
        state.advance()
        return log_probs, None
