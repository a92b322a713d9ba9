"""Putting a run back where a checkpoint left it: weights, optimizer, gradient scaler, data
position and RNG states, and the :class:`~aiayn.training.state.TrainerState` it carries."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.checkpoint.directory import load_checkpoint_config, read_state, resolve_checkpoint, verify_checkpoint
from aiayn.checkpoint.layout import MODEL_FILE, STATE_FILE
from aiayn.checkpoint.training_state import load_optimizer_state, restore_optimizer, restore_rng_state
from aiayn.checkpoint.weights import load_model_weights
from aiayn.config import ModelConfig, to_dict
from aiayn.errors import CheckpointError
from aiayn.training.distributed import DistInfo
from aiayn.training.state import TrainerState, reshard_position

log = logging.getLogger(__name__)


def restore(path: str | Path, *, model: nn.Module, model_cfg: ModelConfig, optimizer: torch.optim.Optimizer,
            scaler: torch.amp.GradScaler, batches: Any, dist: DistInfo, device: torch.device) -> TrainerState:
    """Load the checkpoint at ``path`` (a checkpoint or run directory) into these components;
    the trainer state it holds. ``batches`` (the training iterator) may be None."""
    path = resolve_checkpoint(path)
    verify_checkpoint(path)
    _check_same_model(load_checkpoint_config(path).model, model_cfg, path)
    state = TrainerState.from_json(read_state(path))
    load_model_weights(model, path / MODEL_FILE)
    restore_optimizer(optimizer, load_optimizer_state(path))
    if state.scaler and scaler.is_enabled():
        scaler.load_state_dict(state.scaler)
    if batches is not None and state.data is not None:
        batches.load_state_dict(reshard_position(state.data, state.world_size, dist.world_size, lambda: len(batches)))
    # Last: building the model and optimizer consumed random numbers.
    restore_rng_state(_rng_of_this_rank(state, dist, path), device)
    log.info("resumed from %s at step %d (epoch %s)", path, state.step, state.epoch)
    return state


def _rng_of_this_rank(state: TrainerState, dist: DistInfo, path: Path) -> dict[str, Any]:
    rng = state.rng
    # Another number of processes: rank 0's streams (the recipe says so in one line).
    if dist.enabled and state.rng_per_rank and len(state.rng_per_rank) == dist.world_size:
        rng = state.rng_per_rank[dist.rank]
    if rng is None:
        raise CheckpointError(f"{path / STATE_FILE}: no RNG state; not a training checkpoint")
    return rng


def _check_same_model(saved: ModelConfig, current: ModelConfig, path: Path) -> None:
    a, b = to_dict(saved), to_dict(current)
    diff = [f"model.{k}: checkpoint {a[k]!r}, config {b[k]!r}" for k in a if a.get(k) != b.get(k)]
    if diff:
        raise CheckpointError(f"{path}: the checkpoint's model differs from the configuration "
                              f"({'; '.join(diff)}); use a new run directory for a different model")
