"""The decoder's key/value cache for incremental decoding.

Allocated once per batch of sources: self-attention keys/values get a buffer that fills
one step at a time, up to ``max_len`` positions; it starts short (most outputs end long
before the length bound) and doubles when full, so a batch does not allocate and clear
memory for positions it never reaches. Cross-attention keys/values are computed once from
the encoder output and reused at every step. Beam search calls
:meth:`KVCache.reorder` to follow the surviving hypotheses (and to drop finished
sentences: the index may be shorter than the batch).

Two things keep a beam step cheap on a CPU:

* **Cross-attention keys/values are stored once per source**, not once per row. Beam
  search keeps a sentence's K rows together, so the rows form ``groups`` of equal size
  that share one encoder output; the decoder attends with the group's rows as K queries
  over one copy of the keys (:meth:`KVCache.group_size`). Any other row order falls back
  to one copy per row.
* **The self-attention buffers are double-buffered**: a reorder gathers the filled prefix
  into the spare buffer (one ``index_select`` into place) and swaps, instead of copying
  rows within one buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

INITIAL_POSITIONS = 16  # a new cache's self-attention buffers hold this many (at most max_len)


@dataclass
class LayerCache:
    self_k: Tensor  # (R, H, P, d_k): P positions held, P <= max_len
    self_v: Tensor  # (R, H, P, d_v)
    cross_k: Tensor  # (N, H, S, d_k): one per source group (N = R / group_size)
    cross_v: Tensor  # (N, H, S, d_v)
    spare_k: Tensor | None = None  # the other half of the double buffer (>= R rows)
    spare_v: Tensor | None = None


def _longer(buf: Tensor, positions: int, filled: int) -> Tensor:
    """``buf`` (R, H, P, d) with room for ``positions``; its first ``filled`` positions kept."""
    out = buf.new_empty(buf.shape[:2] + (positions,) + buf.shape[3:])
    out[:, :, :filled] = buf[:, :, :filled]
    out[:, :, filled:] = 0  # zeros past the prefix, not garbage: see KVCache._gather
    return out


def _grouping(sources: Tensor) -> tuple[Tensor, int] | None:
    """Rows' source indices (R,) -> (one source per group, group size) when the rows come
    in equal runs of the same source (e.g. [4, 4, 4, 7, 7, 7]); None otherwise."""
    rows = sources.numel()
    if rows == 0:
        return None
    n_runs = int((sources[1:] != sources[:-1]).sum()) + 1
    if rows % n_runs:
        return None
    groups = sources.view(n_runs, rows // n_runs)
    if not bool((groups == groups[:, :1]).all()):
        return None
    return groups[:, 0], rows // n_runs


class KVCache:
    """Per-layer keys/values plus the source mask; ``length`` target steps are filled."""

    def __init__(self, layers: list[LayerCache], src_mask: Tensor, max_len: int, group_size: int = 1) -> None:
        self.layers = layers
        self.src_mask = src_mask  # (N, 1, 1, S) bool, True on real source tokens; one per group
        self.max_len = max_len
        self.length = 0
        self.group_size = group_size  # consecutive rows sharing one source (cross K/V, mask)

    @classmethod
    def allocate(cls, cross_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor,
                 max_len: int) -> KVCache:
        layers = []
        positions = min(max_len, INITIAL_POSITIONS)
        for k, v in cross_kv:  # (B, H, S, d_k), (B, H, S, d_v)
            b, h = k.shape[:2]
            layers.append(LayerCache(
                self_k=torch.zeros((b, h, positions, k.size(-1)), dtype=k.dtype, device=k.device),
                self_v=torch.zeros((b, h, positions, v.size(-1)), dtype=v.dtype, device=v.device),
                cross_k=k, cross_v=v,
            ))
        return cls(layers, src_mask, max_len)

    @property
    def batch_size(self) -> int:
        """Rows (hypotheses), i.e. the decoder's batch."""
        return self.layers[0].self_k.size(0) if self.layers else self.src_mask.size(0) * self.group_size

    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store one step's keys (R, H, 1, d_k) and values (R, H, 1, d_v); return all filled
        ones, (R, H, t+1, d_k) and (R, H, t+1, d_v)."""
        self.check_room()
        c = self.layers[layer]
        if self.length >= c.self_k.size(2):
            self._grow(c, 2 * c.self_k.size(2))
        c.self_k[:, :, self.length] = k[:, :, 0]
        c.self_v[:, :, self.length] = v[:, :, 0]
        return c.self_k[:, :, :self.length + 1], c.self_v[:, :, :self.length + 1]

    def reserve(self, positions: int) -> None:
        """Make every layer's buffers hold at least ``positions`` (at most ``max_len``)."""
        for c in self.layers:
            if c.self_k.size(2) < positions:
                self._grow(c, positions)

    def _grow(self, c: LayerCache, positions: int) -> None:
        """Room for ``positions`` (at most ``max_len``) in layer ``c``; the filled ones kept."""
        positions = min(self.max_len, positions)
        c.self_k, c.self_v = _longer(c.self_k, positions, self.length), _longer(c.self_v, positions, self.length)
        c.spare_k = c.spare_v = None  # the spare half is reallocated at the new length when needed

    def check_room(self) -> None:
        """Raise unless one more position fits (a full cache must not overwrite its last one)."""
        if self.length >= self.max_len:
            raise RuntimeError(f"KV cache full: max_len={self.max_len} steps")

    def advance(self) -> None:
        self.length += 1

    def reorder(self, index: Tensor, same_sources: bool = False) -> None:
        """Keep rows ``index`` (R',) in that order, e.g. beam parents.

        ``same_sources``: every row stays with its own sentence (beams moved within their
        sentence, none added or dropped), so the per-source cross-attention keys/values and
        mask stay as they are; only the self-attention prefix follows the parents.
        """
        rows = index.numel()
        if same_sources and bool((index == torch.arange(rows, device=index.device)).all()):
            return
        self._reorder_self(index)
        if same_sources:
            return
        self._regroup_sources(index)

    def _reorder_self(self, index: Tensor) -> None:
        """The self-attention prefix follows the rows ``index``."""
        for c in self.layers:
            c.self_k, c.spare_k = self._gather(c.self_k, c.spare_k, index, self.length)
            c.self_v, c.spare_v = self._gather(c.self_v, c.spare_v, index, self.length)

    def _regroup_sources(self, index: Tensor) -> None:
        """Cross-attention keys/values and the source mask follow the rows ``index``."""
        rows = index.numel()
        # Which source each new row reads; regroup the cross keys/values by it.
        sources = torch.div(index, self.group_size, rounding_mode="floor")
        grouped = _grouping(sources)
        if grouped is not None:
            keep, self.group_size = grouped
        else:  # rows of one source not kept together: one copy per row
            keep, self.group_size = sources, 1
        if keep.numel() == self.src_mask.size(0) and bool((keep == torch.arange(
                keep.numel(), device=keep.device)).all()):
            return  # e.g. the first beam step: each source now has K rows, same sources
        for c in self.layers:
            c.cross_k = c.cross_k.index_select(0, keep)
            c.cross_v = c.cross_v.index_select(0, keep)
        self.src_mask = self.src_mask.index_select(0, keep)
        assert rows == self.src_mask.size(0) * self.group_size

    @staticmethod
    def _gather(buf: Tensor, spare: Tensor | None, index: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Rows ``index`` of ``buf``'s filled prefix, written into the spare buffer (a view of
        its first rows; a new one when the batch grows). Returns (new buffer, new spare)."""
        target = KVCache._target(buf, spare, index.numel())
        # Only the filled prefix is worth copying; later positions get overwritten.
        torch.index_select(buf[:, :, :n], 0, index, out=target[:, :, :n])
        return target, buf

    @staticmethod
    def _target(buf: Tensor, spare: Tensor | None, rows: int) -> Tensor:
        """Where a reorder writes ``rows`` rows of ``buf``: a view of the first rows of the spare
        buffer (contiguous, reused in place), or of a new one when the batch grows."""
        if spare is None or spare.size(0) < rows:  # (growing the buffers drops the spare)
            # zeros, not empty: past the prefix a buffer then only ever holds finite values,
            # which a step that attends over every position with the unfilled ones masked
            # needs (a masked weight is 0, and 0 x NaN garbage would be NaN).
            spare = torch.zeros((rows,) + buf.shape[1:], dtype=buf.dtype, device=buf.device)
        return spare[:rows]
