"""Learning-rate schedules: pure functions of the (1-based) update number.

* ``noam``: the paper's ``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (section 5.3),
  times an optional scale; peaks at step = warmup (about 7.0e-4 for d_model 512, warmup 4000).
* ``inverse_sqrt``: fairseq's; linear from ``init_lr`` to ``peak_lr`` over ``warmup``
  updates, then ``peak_lr * sqrt(warmup / step)``.
* ``constant``: linear warmup from ``init_lr`` to ``peak_lr``, then flat.

Update number ``step`` uses ``lr(step)``; step 0 is treated as step 1 (no zero rate).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from aiayn.config import TrainConfig


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


def make_schedule(train: TrainConfig, d_model: int) -> Callable[[int], float]:
    """The schedule that ``train.lr_schedule`` names, as ``step -> lr``."""
    kind = train.lr_schedule
    if kind == "noam":
        return lambda step: noam_lr(step, d_model, train.warmup_steps, train.lr_scale)
    if kind == "inverse_sqrt":
        return lambda step: inverse_sqrt_lr(step, train.lr, train.warmup_steps, train.warmup_init_lr)
    if kind == "constant":
        return lambda step: constant_lr(step, train.lr, train.warmup_steps, train.warmup_init_lr)
    raise ValueError(f"unknown lr_schedule {kind!r}")
