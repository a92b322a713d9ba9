"""Static batch shapes for a training forward captured in CUDA graphs (``train.compile_mode:
reduce-overhead``).

``torch.compile(mode="reduce-overhead")`` replays a recorded CUDA graph per input shape: one
launch for the whole forward (and one for backward) instead of one per operator. Token-budget
batches come in as many shapes as there are sentence lengths, so here every batch is padded to
a bucket: its source and target lengths up to the next multiple of ``train.length_multiple``,
and its rows up to ``max_tokens // longer bucket`` (what the budget allows at that length).
A batch's shape is then a function of its two length buckets, whatever its sentences.

The batcher sees the bucketed lengths too (:class:`BucketedPairs`), so that a batch's padded
size stays within ``max_tokens``, as without buckets. The padding is masked: extra positions
are padding tokens, extra rows a source of one EOS (every attention row has a key) and a target
of padding only, so they add nothing to the loss and exactly nothing to the gradients. The loss
equals the unpadded batch's up to the order of float32 additions
(tests/training/test_static_shapes.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from aiayn.config import TrainConfig
from aiayn.data.batching import Batch
from aiayn.vocab import BOS_ID, EOS_ID, PAD_ID

COMPILE_MODES = ("default", "reduce-overhead")


def compiled_forward(model: nn.Module, mode: str | None) -> Any:
    """``model`` as the trainer runs its forward: eager (``mode`` None), ``torch.compile``d
    (``default``) or compiled with CUDA graphs (``reduce-overhead``: shapes that recur replay a
    recorded graph; the first shapes compile, later ones reuse a dynamic-shape graph)."""
    if mode is None:
        return model
    if mode == "default":
        return torch.compile(model)
    return torch.compile(model, mode=mode)


def step_begins() -> None:
    """Tell the CUDA graph trees that a new forward begins (the last one's outputs are done)."""
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if mark is not None:
        mark()


def _round_up(n: np.ndarray | int, multiple: int) -> Any:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class StaticShapes:
    """The bucket of each batch: lengths to a multiple of ``length_multiple``, rows to what
    ``max_tokens`` allows at the longer bucketed side."""

    length_multiple: int
    max_tokens: int

    @classmethod
    def for_config(cls, train: TrainConfig) -> StaticShapes:
        return cls(train.length_multiple, train.max_tokens)

    def shape(self, rows: int, src_len: int, tgt_len: int) -> tuple[int, int, int]:
        """(rows, source length, target length) of the padded batch; lengths as the tensors
        count them (source with EOS, target with BOS / EOS)."""
        src_b = _round_up(src_len, self.length_multiple)
        tgt_b = _round_up(tgt_len, self.length_multiple)
        return max(rows, self.max_tokens // max(src_b, tgt_b)), src_b, tgt_b

    def pad(self, batch: Batch) -> Batch:
        """``batch`` padded to its bucket's shape; its token counts stay those of its sentences."""
        rows, src_len, tgt_len = self.shape(batch.size, batch.src.size(1), batch.tgt_out.size(1))
        if (rows, src_len, tgt_len) == (batch.size, batch.src.size(1), batch.tgt_out.size(1)):
            return batch
        src = torch.full((rows, src_len), PAD_ID, dtype=batch.src.dtype)
        tgt_in = torch.full((rows, tgt_len), PAD_ID, dtype=batch.tgt_in.dtype)
        tgt_out = torch.full((rows, tgt_len), PAD_ID, dtype=batch.tgt_out.dtype)
        b, s, t = batch.size, batch.src.size(1), batch.tgt_out.size(1)
        src[:b, :s] = batch.src
        tgt_in[:b, :t] = batch.tgt_in
        tgt_out[:b, :t] = batch.tgt_out
        src[b:, 0] = EOS_ID  # a row of padding alone would attend over no key at all
        tgt_in[b:, 0] = BOS_ID
        ids = torch.cat([batch.ids, torch.full((rows - b,), -1, dtype=batch.ids.dtype)])
        return Batch(src, tgt_in, tgt_out, ids, batch.n_src_tokens, batch.n_tgt_tokens)

    def bucket_sizes(self, src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sentence sizes as the batcher counts them (source with EOS, target without BOS /
        EOS), rounded up so that the batcher's padded cost is the bucketed batch's."""
        src = _round_up(np.asarray(src_sizes, dtype=np.int64), self.length_multiple)
        tgt = _round_up(np.asarray(tgt_sizes, dtype=np.int64) + 1, self.length_multiple) - 1
        return src, tgt


class BucketedPairs:
    """A dataset (:class:`~aiayn.data.batching.SizedPairs`) whose sizes, as the batcher sees
    them, are :meth:`StaticShapes.bucket_sizes`; everything else is the dataset's own."""

    def __init__(self, pairs: Any, shapes: StaticShapes) -> None:
        self._pairs = pairs
        self._shapes = shapes
        self._sizes = shapes.bucket_sizes(pairs.src_sizes, pairs.tgt_sizes)
        if hasattr(pairs, "epoch_sizes"):  # lengths that change by epoch (subword sampling)
            self.epoch_sizes = self._epoch_sizes

    def _epoch_sizes(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        return self._shapes.bucket_sizes(*self._pairs.epoch_sizes(epoch))

    @property
    def src_sizes(self) -> np.ndarray:
        return self._sizes[0]

    @property
    def tgt_sizes(self) -> np.ndarray:
        return self._sizes[1]

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self._pairs[i]

    def __getattr__(self, name: str) -> Any:  # padded(), epoch_pairs(), ...: the dataset's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._pairs, name)
