"""The batches of each update: ``update_freq`` batches at a time from the training iterator."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class UpdateGroups:
    """``next()`` -> the batches of the next update: ``update_freq`` of them, fewer at the end
    of an epoch (a group never spans two epochs, so an epoch's end is an update's end), none
    once ``epochs_done(epoch)`` holds for the epoch about to start.

    ``batches`` has the :class:`~aiayn.data.batching.BatchIterator` protocol: iterating it
    gives the rest of the current epoch, and it keeps its own position (``epoch``,
    ``offset``) for checkpoints.
    """

    def __init__(self, batches: Any, update_freq: int, epochs_done: Callable[[int], bool]) -> None:
        self.batches = batches
        self.update_freq = update_freq
        self.epochs_done = epochs_done
        self._epoch_iter: Iterator[Any] | None = None

    def restart(self) -> None:
        """Continue from the iterator's position as it is now (after a resume set it)."""
        self.close()

    def close(self) -> None:
        """End the pass over the epoch in progress (and a prefetching thread it has); the
        next group starts a new one at the iterator's position, which is unchanged."""
        epoch_iter, self._epoch_iter = self._epoch_iter, None
        close = getattr(epoch_iter, "close", None)
        if close is not None:
            close()

    def next(self) -> list[Any]:
        group: list[Any] = []
        while len(group) < self.update_freq:
            if self._epoch_iter is None:
                if self.epochs_done(self.batches.epoch):
                    break
                self._epoch_iter = iter(self.batches)
            try:
                group.append(next(self._epoch_iter))
            except StopIteration:
                self._epoch_iter = None
                if group:
                    break
        return group


def epoch_progress(batches: Any) -> float:
    """Epochs done, as a fraction (2.5: half-way through the third); 0 without an iterator."""
    if batches is None:
        return 0.0
    n = max(len(batches), 1)
    return round(batches.epoch - 1 + batches.offset / n, 4) if hasattr(batches, "offset") else float(batches.epoch)
