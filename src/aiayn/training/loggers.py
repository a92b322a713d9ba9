"""Where the training scalars go besides ``metrics.jsonl``: TensorBoard and Weights & Biases.

``train.loggers`` names them. ``metrics.jsonl`` is the run's own record (``aiayn plot`` reads
it, a resumed run truncates it) and is written whatever the list says, so naming ``jsonl``
is optional. The others get every scalar of a record under one tag, ``train/<name>`` or
``valid/<name>`` (:func:`scalar_tags`), at the training step; only the main process logs.
"""

from __future__ import annotations

import importlib
import logging
import os
from pathlib import Path
from typing import Any, Protocol

from aiayn.config import TrainConfig
from aiayn.errors import ConfigError
from aiayn.fileio import write_atomic

log = logging.getLogger(__name__)

# What each logger imports; its extra has the same name (pip install "aiayn[wandb]").
_MODULES = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb"}
# The W&B run of a run directory: a resumed run goes on logging to the same one.
WANDB_ID_FILE = "wandb_run_id"
# Where a record was taken, not what it measured: the step is the x axis, and epoch and
# elapsed time stay in metrics.jsonl (both loggers keep their own wall clock).
_POSITION = frozenset({"split", "step", "epoch", "elapsed"})


class ScalarLogger(Protocol):
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def selected(train_config: TrainConfig) -> list[str]:
    """The loggers besides metrics.jsonl, in the order named; the deprecated
    ``train.tensorboard: true`` adds tensorboard."""
    names = [name for name in train_config.loggers if name != "jsonl"]
    if train_config.tensorboard:
        names.append("tensorboard")
    return list(dict.fromkeys(names))


def check_available(train_config: TrainConfig) -> None:
    """A :class:`ConfigError` naming the field and the pip command if a logger's package is
    missing: checked before the run starts, not at its first log line."""
    for name in selected(train_config):
        try:
            importlib.import_module(_MODULES[name])
        except ImportError:
            field = "train.loggers" if name in train_config.loggers else "train.tensorboard"
            raise ConfigError(f'{field}: {name} is not installed: pip install "aiayn[{name}]" '
                              f"(or leave {name} out of train.loggers)") from None


def scalar_tags(record: dict[str, Any]) -> dict[str, float]:
    """A ``metrics.jsonl`` record as tagged scalars: ``{"split": "valid", "valid_loss": 2.1}``
    -> ``{"valid/loss": 2.1}``; ``{"split": "train", "lr": 1e-3}`` -> ``{"train/lr": 1e-3}``."""
    split = str(record.get("split", "train"))
    scalars = {}
    for key, value in record.items():
        if key in _POSITION or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        scalars[f"{split}/{key.removeprefix(split + '_')}"] = float(value)
    return scalars


class TensorBoardLogger:
    """Event files in ``run_dir/tensorboard``."""

    def __init__(self, run_dir: Path, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run hides what a killed run logged after its checkpoint (it logs those
        # steps again), as metrics.jsonl drops them.
        purge = start_step + 1 if start_step else None
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A W&B run named after the run directory; its id is kept in ``run_dir/wandb_run_id``
    so that a resumed run continues it. The configuration is logged when it starts."""

    def __init__(self, run_dir: Path, train_config: TrainConfig, config: dict[str, Any]) -> None:
        import wandb

        id_file = run_dir / WANDB_ID_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else None
        options: dict[str, Any] = {"project": train_config.wandb_project, "id": run_id, "resume": "allow",
                                   "name": train_config.wandb_run_name or run_dir.resolve().name}
        if run_id is None:
            options["config"] = config
        if not os.environ.get("WANDB_DIR"):  # beside the run's other files, unless told otherwise
            options["dir"] = str(run_dir)
        try:
            self.run = wandb.init(**options)
        except wandb.errors.Error as exc:
            raise ConfigError(f"train.loggers: wandb could not start a run ({exc}); log in with "
                              "`wandb login`, or set WANDB_MODE=offline") from None
        if run_id is None:
            write_atomic(id_file, f"{self.run.id}\n")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def open_loggers(train_config: TrainConfig, run_dir: Path, config: dict[str, Any],
                 start_step: int) -> list[ScalarLogger]:
    """The loggers of ``train.loggers`` for a run in ``run_dir`` starting at ``start_step``
    (``config``: the whole configuration, for W&B)."""
    if train_config.tensorboard:
        log.warning("train.tensorboard is deprecated: write train.loggers: [jsonl, tensorboard]")
    check_available(train_config)
    opened: list[ScalarLogger] = []
    try:
        for name in selected(train_config):
            opened.append(TensorBoardLogger(run_dir, start_step) if name == "tensorboard"
                          else WandbLogger(run_dir, train_config, config))
    except BaseException:
        close_all(opened)
        raise
    return opened


def close_all(loggers: list[ScalarLogger]) -> None:
    for logger in loggers:
        logger.close()
