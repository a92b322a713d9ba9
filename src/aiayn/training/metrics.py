"""Training metrics: ``metrics.jsonl`` in the run directory, and the loggers of
``train.loggers`` (TensorBoard, W&B: :mod:`aiayn.training.loggers`).

One JSON object per line. Training records (``"split": "train"``) carry step, epoch,
loss, nll, ppl, lr, grad_norm, tokens_per_s (target tokens), elapsed, and the batch size as
it really was: src_tokens_per_update and tgt_tokens_per_update (non-pad tokens, EOS
included, summed over processes and accumulated batches, averaged over the interval's
updates) and pad_fraction (pad positions / all positions of the src and tgt_out tensors);
validation records
(``"split": "valid"``) carry step, epoch, valid_loss, valid_nll, valid_ppl (and
valid_bleu when computed), elapsed. Losses are per target token in nats; ``ppl`` is
``exp(nll)``, from the NLL, not the label-smoothed loss. The other loggers get the same
numbers as ``train/<name>`` and ``valid/<name>`` (``valid/loss`` for ``valid_loss``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from aiayn.fileio import write_atomic
from aiayn.training.loggers import ScalarLogger, close_all, scalar_tags

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def perplexity(nll_per_token: float) -> float:
    # Clamp the exponent: a diverging run should log a huge number, not overflow.
    return math.exp(min(nll_per_token, 100.0))


class MetricsLog:
    """Appends records to ``run_dir/metrics.jsonl`` and hands their scalars to the attached
    loggers; a no-op when disabled (no run directory, or not the main process)."""

    def __init__(self, run_dir: str | Path | None, enabled: bool = True) -> None:
        self.enabled = enabled and run_dir is not None
        self.path = Path(run_dir) / METRICS_FILE if run_dir is not None else None
        self.loggers: list[ScalarLogger] = []

    def attach(self, loggers: list[ScalarLogger]) -> None:
        """Loggers to write to as well, until :meth:`close`."""
        self.loggers.extend(loggers)

    def truncate_after(self, step: int) -> None:
        """Drop records beyond ``step``: they came from a run that was killed after its last
        checkpoint, and the resumed run writes them again."""
        if not self.enabled or self.path is None or not self.path.is_file():
            return
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                dropped += 1
                continue
            if int(rec.get("step", 0)) <= step:
                kept.append(line)
            else:
                dropped += 1
        if dropped:
            write_atomic(self.path, "".join(line + "\n" for line in kept), durable=False)
            log.info("metrics.jsonl: dropped %d record(s) after step %d (resumed run)", dropped, step)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled or self.path is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.loggers:
            scalars = scalar_tags(record)
            for logger in self.loggers:
                logger.log(scalars, int(record["step"]))

    def close(self) -> None:
        """Close the attached loggers (metrics.jsonl is opened per record)."""
        loggers, self.loggers = self.loggers, []
        close_all(loggers)
