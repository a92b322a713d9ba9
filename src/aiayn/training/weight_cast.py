"""Matmul weights cast to the autocast dtype once per forward pass, in a few batched operators.

Under autocast every ``nn.Linear`` casts its float32 weight and bias to bf16/fp16 when it
runs, and backward casts each of their gradients back: two copies per tensor and step, each a
kernel launch on a GPU (Transformer base: 192 tensors, 384 launches). :func:`cast_weights_once`
changes that from outside the model: each layer (an element of ``encoder_layers`` /
``decoder_layers``) casts all its matmul weights and biases when it is entered, with one
``torch._foreach_copy_`` into fresh tensors, and its linear layers use those copies; in backward
one more ``_foreach_copy_`` turns the layer's gradients back to float32 for the float32 master
weights (which the optimizer keeps updating). Per layer, so that under DDP each layer's
gradients are ready, and reduced, as soon as backward has passed it.

The results are those of autocast bit for bit: the same round-to-nearest casts, the same
matmuls, the same float32 gradients (tests/training/test_weight_cast.py). The parameters stay
the model's own (same objects, same names in the state dict); the linear layers change class
to :class:`CastOnceLinear`, which outside an entered layer, or without autocast, is
``nn.Linear``. The tied embedding / output projection is not cast here: the embedding lookup
reads it in float32 and the fused loss casts it once per forward itself.

Where it is used is decided in :func:`cast_once_pays`. On a GPU the batched copy is one kernel
where torch fuses ``_foreach_copy_`` across dtypes (torch 2.4 and later), per-tensor copies
otherwise (no more than autocast's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Elements of 2 bytes in 16: where every copy starts.
_ALIGN_ELEMENTS = 8


def cast_once_pays(device: torch.device, amp_dtype: torch.dtype | None, compiled: bool) -> bool:
    """Whether the trainer casts weights once per forward pass: under bf16/fp16 autocast on
    a CUDA device, with an eager forward. On a CPU the per-use casts stay (they cost no kernel
    launch there, and the CPU results stay those of plain autocast); a compiled forward fuses
    the casts itself."""
    return device.type == "cuda" and amp_dtype is not None and not compiled


class _CastOnce(torch.autograd.Function):
    """float32 tensors -> fresh copies in ``dtype``; gradients -> float32, one operator each way."""

    @staticmethod
    def forward(ctx: Any, dtype: torch.dtype, *masters: Tensor) -> tuple[Tensor, ...]:
        ctx.master_dtypes = [m.dtype for m in masters]
        copies = _empty_like_all(masters, [dtype] * len(masters))
        torch._foreach_copy_(copies, masters)
        return tuple(copies)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:
        out = _empty_like_all(grads, ctx.master_dtypes)
        torch._foreach_copy_(out, list(grads))
        needs = ctx.needs_input_grad[1:]
        return (None, *(g if need else None for g, need in zip(out, needs)))


def _empty_like_all(like: Sequence[Tensor], dtypes: Sequence[torch.dtype]) -> list[Tensor]:
    """Uninitialised contiguous tensors shaped as ``like`` in ``dtypes``: slices of one buffer
    per (dtype, trailing shape) group, so that creating them costs a few operators, not one
    each (a weight's slice along its first dimension needs no reshape)."""
    groups: dict[tuple[torch.dtype, tuple[int, ...]], list[int]] = {}
    for i, (t, dtype) in enumerate(zip(like, dtypes)):
        groups.setdefault((dtype, tuple(t.shape[1:])), []).append(i)
    out: list[Tensor | None] = [None] * len(like)
    for (dtype, tail), members in groups.items():
        row = math.prod(tail)
        # Each tensor starts on a 16-byte boundary (fast matmul kernels need it): rows of
        # padding in between where a row's size does not make it so by itself.
        sizes: list[int] = []
        where: list[int] = []
        start = 0
        for i in members:
            gap = 0
            while (start + gap) * row % _ALIGN_ELEMENTS:
                gap += 1
            if gap:
                sizes.append(gap)
                start += gap
            where.append(len(sizes))
            sizes.append(like[i].shape[0])
            start += like[i].shape[0]
        buffer = torch.empty((start, *tail), dtype=dtype, device=like[members[0]].device)
        parts = torch.split_with_sizes(buffer, sizes)
        for i, k in zip(members, where):
            out[i] = parts[k]
    return out  # type: ignore[return-value]  # every position is filled


class CastOnceLinear(nn.Linear):
    """``nn.Linear`` whose weight and bias come cast from its layer's :class:`_LayerCast`
    while that layer runs under autocast; plain ``nn.Linear`` otherwise."""

    _weight_cast: _LayerCast
    _cast_slot: tuple[int, int | None]  # positions of the weight and bias in the layer's copies

    def forward(self, x: Tensor) -> Tensor:
        cast = self._weight_cast.current
        if cast is None:
            return super().forward(x)
        weight, bias = self._cast_slot
        return F.linear(x, cast[weight], None if bias is None else cast[bias])


class _LayerCast:
    """The cast copies of one layer's linear weights, alive while the layer runs."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.linears = linears
        self.masters: list[Tensor] = []
        for lin in linears:
            weight = len(self.masters)
            self.masters.append(lin.weight)
            bias = None
            if lin.bias is not None:
                bias = len(self.masters)
                self.masters.append(lin.bias)
            lin.__class__ = CastOnceLinear
            object.__setattr__(lin, "_weight_cast", self)
            object.__setattr__(lin, "_cast_slot", (weight, bias))
        self.current: tuple[Tensor, ...] | None = None

    def enter(self, _module: nn.Module, _args: Any) -> None:
        device = self.masters[0].device.type
        if not torch.is_autocast_enabled(device) or self.masters[0].dtype != torch.float32:
            self.current = None
            return
        dtype = torch.get_autocast_dtype(device)
        # Outside autocast's own caching: the cast is recorded by autograd as _CastOnce.
        with torch.autocast(device, enabled=False):
            self.current = _CastOnce.apply(dtype, *self.masters)

    def leave(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        self.current = None


def _layers(model: nn.Module) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for name in ("encoder_layers", "decoder_layers"):
        layers.extend(getattr(model, name, None) or [])
    return layers or [model]


def cast_weights_once(model: nn.Module, layers: Iterable[nn.Module] | None = None) -> int:
    """Make each of ``layers`` (default: the model's encoder and decoder layers, or the model
    itself when it has none) cast its linear weights once when entered; returns the number of
    linear layers concerned. Applying it twice changes nothing more."""
    count = 0
    for layer in _layers(model) if layers is None else layers:
        linears = [m for m in layer.modules() if type(m) is nn.Linear]
        if not linears:
            continue
        cast = _LayerCast(linears)
        layer.register_forward_pre_hook(cast.enter)
        layer.register_forward_hook(cast.leave, always_call=True)
        count += len(linears)
    return count
