"""Dropout (paper section 5.4) with a cheaper mask on CPUs.

``torch.bernoulli_`` draws one double per element from the CPU generator, a visible share
of a training step's time on a CPU. Here every 64-bit draw of the same generator
(``random_`` over the full int64 range) is split into four 16-bit uniforms, and an element
is dropped when its uniform falls below ``round(p * 65536)``: a quarter of the draws for
the same mask. The drop probability is therefore ``p`` rounded to a
multiple of 1/65,536 (0.1 -> 0.100006). The mask is kept as 0/1 in the activation's dtype
and applied by multiplication, never as a bool tensor: torch's CPU kernels that read bools
(``masked_fill_``, ``where``) are slower than a multiplication. The stream
comes from torch's generator, so ``torch.manual_seed`` and the checkpointed RNG state make
runs and resumes reproducible exactly as with ``nn.Dropout``. On GPUs ``F.dropout`` (Philox,
fused) is used unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16


def keep_mask(shape: torch.Size, p: float, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    """1 where an element is kept, 0 where it is dropped (probability ~p), in ``dtype``."""
    n = math.prod(shape)
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(1 << 63), None)
    u = draws.view(torch.int16)[:n].view(shape)  # uniform on [-32768, 32767]
    threshold = round(p * _LEVELS) - _LEVELS // 2  # dropped: u < threshold
    if threshold <= -(_LEVELS // 2):
        return torch.ones(shape, dtype=dtype, device=device)
    if threshold >= _LEVELS // 2:
        return torch.zeros(shape, dtype=dtype, device=device)
    # Clamped to {threshold - 1, threshold}, minus threshold - 1: 0 below the threshold, 1 at
    # or above it. Arithmetic on int16 rather than a comparison, which would make a bool.
    return u.clamp(threshold - 1, threshold).sub_(threshold - 1).to(dtype)


class _KeepScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.mul(x, keep).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability p, scale the rest by 1/(1-p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, True)
    return _KeepScale.apply(x, keep_mask(x.shape, p, x.device, x.dtype), 1.0 / (1.0 - p))


class Dropout(nn.Module):
    """Drop-in for ``nn.Dropout`` (same ``p`` attribute and train/eval behaviour)."""

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
