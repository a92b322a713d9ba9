"""Learning-rate schedules: functions of the (1-based) update number (and, for a decay over a
time budget, of the seconds trained so far).

* ``noam``: the paper's ``d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`` (section 5.3),
  times an optional scale; peaks at step = warmup (about 7.0e-4 for d_model 512, warmup 4000).
* ``inverse_sqrt``: fairseq's; linear from ``init_lr`` to ``peak_lr`` over ``warmup``
  updates, then ``peak_lr * sqrt(warmup / step)``.
* ``constant``: linear warmup from ``init_lr`` to ``peak_lr``, then flat.
* ``cosine`` / ``linear``: linear warmup from ``init_lr`` to ``peak_lr``, then down to
  ``min_lr`` at update ``total`` (``train.max_steps``) along a half cosine or a straight
  line, and ``min_lr`` after it (HF's and fairseq's decay-to-the-end schedules). A run with a
  known length ends on small steps instead of inverse_sqrt's still-large ones, which is what
  checkpoint averaging otherwise has to make up for. With ``train.max_steps`` 0 the decay
  runs over ``train.max_time_minutes`` instead: the number of updates a time budget holds
  depends on the machine, so a step horizon ends too early on a fast CPU and leaves the rate
  high on a slow one; a time horizon reaches ``min_lr`` when the budget ends on either.
  ``train.decay_fraction`` below 1 holds ``lr`` after the warmup and decays over only the
  last share of the horizon (warmup-stable-decay, HF's ``get_wsd_schedule``).

Update number ``step`` uses ``lr(step)``; step 0 is treated as step 1 (no zero rate).
"""

from __future__ import annotations

import math
from typing import Protocol

from aiayn.config import LR_SCHEDULES, TrainConfig


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
             init_lr: float = 0.0, min_lr: float = 0.0, fraction: float = 1.0) -> float:
    """Warmup to ``peak_lr``, then ``shape`` (cosine | linear) down to ``min_lr`` at ``total``
    over the last ``fraction`` of the updates after the warmup, holding ``peak_lr`` before
    them (fraction < 1: warmup-stable-decay)."""
    step = max(step, 1)
    progress = (step - warmup) / max(total - warmup, 1)
    return _warmed_decay(step, progress, peak_lr, warmup, shape, init_lr, min_lr, fraction)


def timed_decay_lr(step: int, elapsed: float, budget: float, peak_lr: float, warmup: int, *,
                   shape: str = "cosine", init_lr: float = 0.0, min_lr: float = 0.0,
                   fraction: float = 1.0) -> float:
    """Warmup to ``peak_lr`` over ``warmup`` updates, then ``shape`` down to ``min_lr`` as
    ``elapsed`` seconds reach ``budget``, over the budget's last ``fraction`` (``peak_lr``
    before it). The decay is measured from the start of training (the warmup's few minutes
    included), so with fraction 1 the rate right after the warmup is already a little under
    the peak: a cosine at 5% of the budget is at 99.4% of it."""
    return _warmed_decay(step, elapsed / budget, peak_lr, warmup, shape, init_lr, min_lr, fraction)


def _warmed_decay(step: int, progress: float, peak_lr: float, warmup: int, shape: str, init_lr: float,
                  min_lr: float, fraction: float) -> float:
    """The warmup by updates, then the rate at ``progress`` (0 to 1, ``min_lr`` past 1) of the horizon:
    ``peak_lr`` until the decay's last ``fraction`` begins, then ``shape`` down to ``min_lr``."""
    step = max(step, 1)
    if step < warmup:
        return constant_lr(step, peak_lr, warmup, init_lr)
    if progress >= 1.0:
        return min_lr
    progress = max(progress - (1.0 - fraction), 0.0) / fraction
    remaining = 0.5 * (1.0 + math.cos(math.pi * progress)) if shape == "cosine" else 1.0 - progress
    return min_lr + (peak_lr - min_lr) * remaining


class Schedule(Protocol):
    """The rate of update ``step`` (1-based) after ``elapsed`` seconds of training."""

    def __call__(self, step: int, elapsed: float = 0.0) -> float: ...


def make_schedule(train: TrainConfig, d_model: int) -> Schedule:
    """The schedule that ``train.lr_schedule`` names, as ``(step, elapsed seconds) -> lr``;
    only a decay over ``max_time_minutes`` (``max_steps`` 0) reads the seconds."""
    kind = train.lr_schedule
    if kind not in LR_SCHEDULES:
        raise ValueError(f"unknown lr_schedule {kind!r}")

    def schedule(step: int, elapsed: float = 0.0) -> float:
        if kind == "noam":
            return noam_lr(step, d_model, train.warmup_steps, train.lr_scale)
        if kind == "inverse_sqrt":
            return inverse_sqrt_lr(step, train.lr, train.warmup_steps, train.warmup_init_lr)
        if kind == "constant":
            return constant_lr(step, train.lr, train.warmup_steps, train.warmup_init_lr)
        if train.max_steps == 0:  # a decay over the time budget
            return timed_decay_lr(step, elapsed, train.max_time_minutes * 60.0, train.lr, train.warmup_steps,
                                  shape=kind, init_lr=train.warmup_init_lr, min_lr=train.min_lr,
                                  fraction=train.decay_fraction)
        return decay_lr(step, train.lr, train.warmup_steps, train.max_steps, shape=kind,
                        init_lr=train.warmup_init_lr, min_lr=train.min_lr, fraction=train.decay_fraction)
    return schedule
