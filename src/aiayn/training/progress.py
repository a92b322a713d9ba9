"""What a run reports: the result of each update, the training record of each log interval,
the optional tqdm progress bar, and the summary at the end."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from aiayn.training.metrics import perplexity
from aiayn.training.state import TrainerState


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
    start: float = field(default_factory=time.monotonic)

    def add(self, result: StepResult) -> None:
        self.loss += result.loss_sum
        self.nll += result.nll_sum
        self.tokens += result.n_tokens
        self.src_tokens += result.n_src_tokens
        self.padded += result.n_padded
        self.steps += 1
        self.grad_norm = result.grad_norm

    def record(self, step: int, epoch: float, lr: float, elapsed: float) -> dict[str, Any]:
        """The ``metrics.jsonl`` record: per-token averages over the interval, and the real
        tokens per update (means over its updates) with the share of padding."""
        tokens = max(self.tokens, 1)
        seconds = max(time.monotonic() - self.start, 1e-9)
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


def show_train_record(record: dict[str, Any], bar: Any, log: logging.Logger) -> None:
    """The record on the progress bar (if any) and as a log line."""
    if bar is not None:
        bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                        tok_s=f"{record['tokens_per_s']:.0f}", refresh=False)
    log.info("step %d | epoch %.2f | loss %.4f | nll %.4f | ppl %.2f | lr %.3e | "
             "gnorm %.3f | %.0f tok/s | %.0f src + %.0f tgt tok/update | pad %.1f%%",
             record["step"], record["epoch"], record["loss"], record["nll"], record["ppl"], record["lr"],
             record["grad_norm"], record["tokens_per_s"], record["src_tokens_per_update"],
             record["tgt_tokens_per_update"], 100.0 * record["pad_fraction"])


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


def progress_bar(enabled: bool, total: int | None, initial: int) -> Any:
    """A tqdm bar in steps on a terminal's stderr, or None (disabled, or not a terminal)."""
    if not (enabled and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr, leave=True)


def logging_around(bar: Any) -> contextlib.AbstractContextManager:
    """Log lines printed above the bar instead of through it."""
    if bar is None:
        return contextlib.nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()
