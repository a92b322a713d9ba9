"""Learning-rate schedules: pure functions of the (1-based) update number.

* ``noam``: the paper's ``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (section 5.3),
  times an optional scale; peaks at step = warmup (about 7.0e-4 for d_model 512, warmup 4000).
* ``inverse_sqrt``: fairseq's; linear from ``init_lr`` to ``peak_lr`` over ``warmup``
  updates, then ``peak_lr * sqrt(warmup / step)``.
* ``constant``: linear warmup from ``init_lr`` to ``peak_lr``, then flat.
* ``cosine`` / ``linear``: linear warmup from ``init_lr`` to ``peak_lr``, then down to
  ``min_lr`` at update ``total`` (``train.max_steps``) along a half cosine or a straight
  line, and ``min_lr`` after it (HF's and fairseq's decay-to-the-end schedules). A run with a
  known length ends on small steps instead of inverse_sqrt's still-large ones, which is what
  checkpoint averaging otherwise has to make up for.

Update number ``step`` uses ``lr(step)``; step 0 is treated as step 1 (no zero rate).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from aiayn.config import DECAY_SCHEDULES, TrainConfig


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    step = max(step, 1)
    warm = step * warmup ** -1.5 if warmup > 0 else math.inf
    return scale * d_model ** -0.5 * min(step ** -0.5, warm)


def inverse_sqrt_lr(step: int, peak_lr: float, warmup: int, init_lr: float = 0.0) -> float:
    step = max(step, 1)
    if warmup <= 0:
        return peak_lr * step ** -0.5
    if step < warmup:
        return init_lr + (peak_lr - init_lr) * step / warmup
    return peak_lr * math.sqrt(warmup / step)


def constant_lr(step: int, peak_lr: float, warmup: int = 0, init_lr: float = 0.0) -> float:
    step = max(step, 1)
    if warmup > 0 and step < warmup:
        return init_lr + (peak_lr - init_lr) * step / warmup
    return peak_lr


def decay_lr(step: int, peak_lr: float, warmup: int, total: int, *, shape: str = "cosine",
             init_lr: float = 0.0, min_lr: float = 0.0) -> float:
    """Warmup to ``peak_lr``, then ``shape`` (cosine | linear) down to ``min_lr`` at ``total``."""
    step = max(step, 1)
    if step < warmup:
        return constant_lr(step, peak_lr, warmup, init_lr)
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(total - warmup, 1)
    remaining = 0.5 * (1.0 + math.cos(math.pi * progress)) if shape == "cosine" else 1.0 - progress
    return min_lr + (peak_lr - min_lr) * remaining


def make_schedule(train: TrainConfig, d_model: int) -> Callable[[int], float]:
    """The schedule that ``train.lr_schedule`` names, as ``step -> lr``."""
    kind = train.lr_schedule
    if kind == "noam":
        return lambda step: noam_lr(step, d_model, train.warmup_steps, train.lr_scale)
    if kind == "inverse_sqrt":
        return lambda step: inverse_sqrt_lr(step, train.lr, train.warmup_steps, train.warmup_init_lr)
    if kind == "constant":
        return lambda step: constant_lr(step, train.lr, train.warmup_steps, train.warmup_init_lr)
    if kind in DECAY_SCHEDULES:
        return lambda step: decay_lr(step, train.lr, train.warmup_steps, train.max_steps, shape=kind,
                                     init_lr=train.warmup_init_lr, min_lr=train.min_lr)
    raise ValueError(f"unknown lr_schedule {kind!r}")
