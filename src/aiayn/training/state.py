"""The trainer's state: one dataclass, saved as a checkpoint's ``state.json`` and read back.

The field names are the keys of ``state.json`` (nested dataclasses are nested objects), so
:meth:`TrainerState.to_json` and :meth:`TrainerState.from_json` need no list of keys of
their own, and a checkpoint written before this class existed reads back unchanged.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class NonfiniteCounts:
    """Updates skipped so far: non-finite loss or gradient (in a row / in all), fp16 overflows."""

    consecutive: int = 0
    total: int = 0
    fp16_overflows: int = 0

    def add(self, nonfinite: bool, overflow: bool) -> None:
        """Count one update: skipped for a non-finite loss/gradient, or for an fp16 overflow."""
        self.fp16_overflows += int(overflow)
        self.total += int(nonfinite)
        self.consecutive = self.consecutive + 1 if nonfinite else 0


@dataclass
class TrainerState:
    """Everything of a run but the weights and the optimizer.

    The trainer keeps the progress fields (``step``, ``nonfinite``, ``tokens_seen``,
    ``best``, ``last_valid``, ``validations_since_best``) current as it goes. The others describe other components at
    the moment a checkpoint is taken (the training iterator's position, the RNG states, the
    gradient scaler, the number of processes); the trainer fills them in its
    ``state_dict`` and hands them back to those components in ``load``. ``elapsed`` is the
    wall time of the run up to then: for a resumed run, the time of its earlier segments.
    """

    step: int = 0  # updates applied; the learning rate is a pure function of it
    epoch: int | None = None  # the training iterator's epoch, for people reading state.json
    data: dict[str, int] | None = None  # the training iterator's position: {"epoch", "offset"}
    scheduler: dict[str, Any] | None = None  # kind, step and rate at the save, for people
    rng: dict[str, Any] | None = None  # Python/NumPy/torch RNG states (of rank 0 under torchrun)
    rng_per_rank: list[dict[str, Any]] | None = None  # every rank's, under torchrun
    world_size: int = 1
    scaler: dict[str, Any] | None = None  # the fp16 gradient scaler's state
    nonfinite: NonfiniteCounts = field(default_factory=NonfiniteCounts)
    tokens_seen: int = 0
    elapsed: float = 0.0
    best: dict[str, Any] | None = None  # {"metric", "value", "step"} of the best validation
    last_valid: dict[str, Any] | None = None  # {"step", **metrics} of the last validation
    # Validations in a row that did not improve on ``best`` (train.patience counts them);
    # saved, so that a resumed run stops at the same validation as one never stopped.
    validations_since_best: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainerState:
        """The state in ``data`` (a ``state.json``); missing keys keep their defaults and
        keys of no field (format version, torch version, ...) are ignored."""
        return _from_json(cls, data)


def _from_json(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, kind = data[f.name], hints[f.name]
        nested = isinstance(kind, type) and dataclasses.is_dataclass(kind)
        if nested and isinstance(value, dict):
            value = _from_json(kind, value)
        elif nested and value is None:
            continue
        values[f.name] = value
    return cls(**values)


def reshard_position(data: dict[str, int], saved_world: int | None, world: int,
                     n_batches: Callable[[], int]) -> dict[str, int]:
    """The iterator position ``data`` saved by ``saved_world`` processes, for ``world`` of them.

    The offset counts this shard's batches: a different number of processes keeps the number
    of batches of the epoch already seen (approximately: shards differ), not the offset, at
    most ``n_batches()``. That count is asked for only then: with subword sampling it means
    segmenting an epoch.
    """
    data = dict(data)
    saved_world = int(saved_world or 1)
    if saved_world != world:
        seen = int(data["offset"]) * saved_world
        data["offset"] = min(seen // world, n_batches())
    return data
