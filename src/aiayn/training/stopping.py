"""When a run stops: step, epoch and wall-time limits, early stopping (patience),
divergence, and SIGINT/SIGTERM.

:class:`StoppingRules` answers the questions the training loop asks after each update;
:class:`StopSignals` turns a signal into a request to stop after the current update (and
save), as cluster schedulers send SIGTERM before they kill a job.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiayn.config import TrainConfig
from aiayn.errors import AiaynError

log = logging.getLogger(__name__)


class TrainingError(AiaynError):
    """Training cannot go on: e.g. the loss stayed non-finite for too many updates."""


@dataclass(frozen=True)
class StoppingRules:
    """The limits of a run; 0 disables a limit (``max_nonfinite`` excepted)."""

    max_steps: int = 0
    max_epochs: int = 0
    max_time_minutes: float = 0.0
    max_nonfinite: int = 1
    patience: int = 0  # validations in a row without improvement

    @classmethod
    def from_config(cls, train_config: TrainConfig) -> StoppingRules:
        return cls(max_steps=train_config.max_steps, max_epochs=train_config.max_epochs,
                   max_time_minutes=train_config.max_time_minutes, max_nonfinite=train_config.max_nonfinite,
                   patience=train_config.patience)

    def steps_done(self, step: int) -> bool:
        return bool(self.max_steps) and step >= self.max_steps

    def epochs_done(self, epoch: int) -> bool:
        """``epoch`` is the one about to start (1-based)."""
        return bool(self.max_epochs) and epoch > self.max_epochs

    def out_of_patience(self, validations_since_best: int) -> bool:
        return bool(self.patience) and validations_since_best >= self.patience

    def patience_message(self, metric: str, best: dict[str, Any] | None) -> str:
        """The log line of an early stop: why, and where the best result was."""
        where = f"; the best, {best['value']:.4f}, was at step {best['step']}" if best else ""
        return (f"early stopping: {metric} has not improved for {self.patience} validation(s) "
                f"in a row (train.patience={self.patience}){where}")

    def diverged(self, nonfinite_in_a_row: int) -> bool:
        return nonfinite_in_a_row >= self.max_nonfinite

    def out_of_time(self, elapsed: float, update_seconds: float, finish_seconds: float) -> bool:
        """True if one more update (as long as the last one) plus the final validation and
        save (as long as the last ones) would end past the budget: a budget is not a
        trigger, so the run stops before it, not after."""
        return bool(self.max_time_minutes) and \
            elapsed + update_seconds + finish_seconds >= self.max_time_minutes * 60

    def reason(self, step: int, out_of_time: bool, signalled: bool) -> str | None:
        """Why the run stops after the update that reached ``step`` (None: it goes on)."""
        if self.steps_done(step):
            return "max_steps"
        if out_of_time:
            return "max_time"
        if signalled:
            return "signal"
        return None

    def divergence_error(self, nonfinite_in_a_row: int, step: int, last_checkpoint: str | None) -> TrainingError:
        return TrainingError(
            f"the loss was non-finite for {nonfinite_in_a_row} consecutive updates "
            f"(train.max_nonfinite={self.max_nonfinite}) after step {step}; training "
            f"stopped. The last good checkpoint is {last_checkpoint or '(none written yet)'}. Try a lower "
            "learning rate (train.lr_scale / train.lr), gradient clipping (train.clip_norm), "
            "or bf16 instead of fp16.")


class StopSignals:
    """While :meth:`installed`, SIGINT/SIGTERM set :attr:`received`; the loop stops after the
    current update and saves. A second Ctrl-C aborts at once, without saving."""

    def __init__(self) -> None:
        self.received: int | None = None

    def handler(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum
        log.warning("received %s: stopping after this step and saving a checkpoint "
                    "(Ctrl-C again to abort without saving)", signal.Signals(signum).name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers, and the previous ones back afterwards (only the main thread may
        install handlers: elsewhere, signals keep their handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)
