"""What a run reports: the result of each update, the training record of each log interval
(with the time elapsed and an estimate of the time left), the optional tqdm progress bar,
and the summary at the end."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aiayn.training.metrics import perplexity
from aiayn.training.state import TrainerState
from aiayn.training.stopping import StoppingRules


@dataclass
class StepResult:
    """What one update did (sums over all processes)."""

    loss_sum: float
    nll_sum: float
    n_tokens: int
    n_sentences: int
    grad_norm: float
    lr: float
    updated: bool  # False: skipped (non-finite loss/gradient, or an fp16 overflow)
    nonfinite: bool  # the loss or gradient was NaN/inf
    n_src_tokens: int = 0  # non-pad source tokens (with EOS); n_tokens counts the target's
    n_padded: int = 0  # positions of the padded src and tgt_out tensors, pads included


@dataclass
class Interval:
    """Accumulates the updates between two training records."""

    loss: float = 0.0
    nll: float = 0.0
    tokens: int = 0
    src_tokens: int = 0
    padded: int = 0
    steps: int = 0
    grad_norm: float = 0.0  # the last update's
    start: float = field(default_factory=lambda: time.monotonic())  # looked up per call: tests fake the clock

    def add(self, result: StepResult) -> None:
        self.loss += result.loss_sum
        self.nll += result.nll_sum
        self.tokens += result.n_tokens
        self.src_tokens += result.n_src_tokens
        self.padded += result.n_padded
        self.steps += 1
        self.grad_norm = result.grad_norm

    def seconds(self) -> float:
        """Wall time since the interval began (validations and saves within it included)."""
        return max(time.monotonic() - self.start, 1e-9)

    def record(self, step: int, epoch: float, lr: float, elapsed: float) -> dict[str, Any]:
        """The ``metrics.jsonl`` record: per-token averages over the interval, and the real
        tokens per update (means over its updates) with the share of padding."""
        tokens = max(self.tokens, 1)
        seconds = self.seconds()
        nll = self.nll / tokens
        steps = max(self.steps, 1)
        real = self.src_tokens + self.tokens
        return {
            "split": "train", "step": step, "epoch": epoch,
            "loss": self.loss / tokens, "nll": nll, "ppl": perplexity(nll), "lr": lr,
            "grad_norm": self.grad_norm, "tokens_per_s": self.tokens / seconds,
            "elapsed": round(elapsed, 3),
            "src_tokens_per_update": self.src_tokens / steps, "tgt_tokens_per_update": self.tokens / steps,
            "pad_fraction": 1.0 - real / self.padded if self.padded else 0.0,
        }


def show_train_record(record: dict[str, Any], bar: Any, log: logging.Logger,
                      left: tuple[float, str] | None = None) -> None:
    """The record on the progress bar (if any) and as a log line, which ends with the time
    elapsed and ``left`` (:func:`time_left`) when there is an estimate."""
    if bar is not None:
        bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                        tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
    log.info("step %d | epoch %.2f | loss %.4f | nll %.4f | ppl %.2f | lr %.3e | "
             "gnorm %.3f | %.0f tok/s | %.0f src + %.0f tgt tok/update | pad %.1f%% | %s",
             record["step"], record["epoch"], record["loss"], record["nll"], record["ppl"], record["lr"],
             record["grad_norm"], record["tokens_per_s"], record["src_tokens_per_update"],
             record["tgt_tokens_per_update"], 100.0 * record["pad_fraction"],
             timing_text(record["elapsed"], left))


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (hours unbounded: ``27:03:04``), rounded to the second."""
    minutes, secs = divmod(round(max(seconds, 0.0)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def timing_text(elapsed: float, left: tuple[float, str] | None) -> str:
    """``elapsed 0:01:40 | eta 0:15:00 (max_steps)``: the limit named is the one expected to
    end the run first."""
    text = f"elapsed {format_duration(elapsed)}"
    return text if left is None else f"{text} | eta {format_duration(left[0])} ({left[1]})"


def time_left(rules: StoppingRules, *, step: int, epoch: float, elapsed: float, seconds_per_step: float,
              updates_per_epoch: int | None) -> tuple[float, str] | None:
    """Seconds until the first limit ends the run, and its name; None without a limit.

    ``max_steps`` and ``max_epochs`` (when the updates of an epoch are known) count the
    updates left at ``seconds_per_step`` (the recent rate); ``max_time_minutes`` is the
    budget left. ``epoch`` is fractional (1.5: half-way through the second)."""
    left = []
    if rules.max_steps:
        left.append(((rules.max_steps - step) * seconds_per_step, "max_steps"))
    if rules.max_epochs and updates_per_epoch:
        left.append(((rules.max_epochs - epoch) * updates_per_epoch * seconds_per_step, "max_epochs"))
    if rules.max_time_minutes:
        left.append((rules.max_time_minutes * 60 - elapsed, "max_time"))
    if not left:
        return None
    seconds, limit = min(left)
    return max(seconds, 0.0), limit


def run_summary(stop_reason: str, state: TrainerState, *, epoch: float, elapsed: float,
                last_checkpoint: Any, best_checkpoint: Any, world_size: int, device: Any,
                dtype: str) -> dict[str, Any]:
    """The content of ``train_summary.json``: how and where the run stopped."""
    return {
        "stop_reason": stop_reason, "step": state.step, "epoch": epoch,
        "elapsed": round(elapsed, 3), "tokens_seen": state.tokens_seen,
        "nonfinite_skipped": state.nonfinite.total, "fp16_overflows": state.nonfinite.fp16_overflows,
        "last_valid": state.last_valid, "best": state.best,
        "last_checkpoint": str(last_checkpoint) if last_checkpoint else None,
        "best_checkpoint": str(best_checkpoint) if best_checkpoint else None,
        "world_size": world_size, "device": str(device), "dtype": dtype,
    }


@dataclass(frozen=True)
class BarTotal:
    """What the progress bar counts: ``step`` (updates) or ``min`` (minutes of wall time),
    up to ``total`` (None: no total), from ``initial`` (a resumed run's position)."""

    unit: str
    total: float | None
    initial: float


def bar_total(rules: StoppingRules, *, step: int, elapsed: float, updates_per_epoch: int | None) -> BarTotal:
    """Steps when a limit fixes their number (``max_steps``; ``max_epochs`` times the updates
    of an epoch; the smaller of the two), else the minutes of ``max_time_minutes``, else steps
    without a total. The log lines' ETA weighs every limit; the bar can show only one."""
    steps = [n for n in (rules.max_steps, rules.max_epochs * (updates_per_epoch or 0)) if n]
    if steps:
        return BarTotal("step", min(steps), step)
    if rules.max_time_minutes:
        return BarTotal("min", rules.max_time_minutes, round(elapsed / 60, 2))
    return BarTotal("step", None, step)


_MINUTES_FORMAT = "{l_bar}{bar}| {n:.1f}/{total:.1f} min [{elapsed}<{remaining}{postfix}]"


def progress_bar(enabled: bool, total: BarTotal) -> Any:
    """A tqdm bar on a terminal's stderr, or None (disabled, or not a terminal)."""
    if not (enabled and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total.total, initial=total.initial, unit=total.unit, dynamic_ncols=True, file=sys.stderr,
                leave=True, bar_format=_MINUTES_FORMAT if total.unit == "min" else None)


def advance_bar(bar: Any, elapsed: float) -> None:
    """One more step, or the bar of a time budget at ``elapsed`` seconds."""
    if bar is None:
        return
    if bar.unit == "min":
        bar.update(round(elapsed / 60, 2) - bar.n)
    else:
        bar.update(1)


def logging_around(bar: Any) -> contextlib.AbstractContextManager:
    """Log lines printed above the bar instead of through it."""
    if bar is None:
        return contextlib.nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()
