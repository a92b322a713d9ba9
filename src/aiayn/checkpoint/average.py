"""Checkpoint averaging (paper section 6.1): the last 5 checkpoints for base, last 20 for big.

The parameters of N checkpoints of one run are averaged element-wise (summed in float64,
then cast back) into a normal checkpoint directory that every other command loads.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from aiayn.checkpoint.directory import (
    load_checkpoint_config,
    read_state,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from aiayn.checkpoint.layout import CHECKPOINTS_DIR, MODEL_FILE, TOKENIZER_DIR
from aiayn.checkpoint.manager import list_checkpoints
from aiayn.checkpoint.weights import load_model_tensors, read_model_weights
from aiayn.config import Config, to_dict
from aiayn.errors import CheckpointError
from aiayn.model import build_model

log = logging.getLogger(__name__)


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The newest ``n`` complete periodic checkpoints (``step_*``) of a run (or checkpoints)
    directory, oldest first: the paper's "last N checkpoints, written at 10-minute intervals".
    A checkpoint written only because validation improved (``best_step_*``) is not one."""
    if n < 1:
        raise CheckpointError(f"--last: need at least 1 checkpoint, got {n}")
    d = Path(run_dir)
    if (d / CHECKPOINTS_DIR).is_dir():
        d = d / CHECKPOINTS_DIR
    found = list_checkpoints(d)
    if not found:
        raise CheckpointError(f"{run_dir}: no checkpoints found (expected step_* directories in "
                              f"{d})")
    if len(found) < n:
        raise CheckpointError(
            f"{d}: asked for the last {n} checkpoints but only {len(found)} exist "
            f"({', '.join(p.name for p in found)}); raise train.keep_last to keep more")
    return found[-n:]


def average_weights(paths: list[str | Path]) -> tuple[dict[str, torch.Tensor], Config, list[Path]]:
    """Element-wise mean (float64 sums) of the weights of ``paths``, with the configuration
    of the last one; all must describe the same model. Used by ``aiayn average`` and by
    ``Translator.from_checkpoint`` given several paths."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    dirs = [resolve_checkpoint(p) for p in paths]
    cfg = load_checkpoint_config(dirs[-1])
    total: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for d in dirs:
        verify_checkpoint(d)
        other = load_checkpoint_config(d)
        if to_dict(other.model) != to_dict(cfg.model):
            raise CheckpointError(f"{d}: a different model than {dirs[-1]}; only checkpoints of "
                                  "one model can be averaged")
        tensors = read_model_weights(d / MODEL_FILE)
        if reference and set(tensors) != set(reference):  # every name, integer tensors too
            raise CheckpointError(f"{d}: its weight names differ from {dirs[0]}")
        for name, t in tensors.items():
            if not t.is_floating_point():
                reference[name] = t
                continue
            acc = total.get(name)
            total[name] = t.double() if acc is None else acc + t.double()
            reference[name] = t
    averaged = {name: (total[name] / len(dirs)).to(reference[name].dtype) if name in total
                else reference[name] for name in reference}
    return averaged, cfg, dirs


def average_checkpoints(paths: list[str | Path], out: str | Path) -> Path:
    """Average the weights of ``paths`` (checkpoint directories) into checkpoint ``out``.

    The configuration and tokenizer come from the last checkpoint; all must describe the
    same model. The result has no optimizer state (it is for decoding, or ``init_from``).
    """

    if not paths:
        raise CheckpointError("no checkpoints to average")
    out = Path(out).resolve()
    if any(resolve_checkpoint(p).resolve() == out for p in paths):
        raise CheckpointError(f"{out}: the output would overwrite one of the inputs")
    averaged, cfg, dirs = average_weights(paths)
    model = build_model(cfg.model)
    load_model_tensors(model, averaged, dirs[-1] / MODEL_FILE)
    states = [read_state(d) for d in dirs]
    state = {
        "step": states[-1].get("step"),
        "epoch": states[-1].get("epoch"),
        "averaged_from": [str(d) for d in dirs],
        "averaged_steps": [s.get("step") for s in states],
    }
    tok = dirs[-1] / TOKENIZER_DIR
    path = save_checkpoint(out, model, cfg, tokenizer=tok if tok.is_dir() else None,
                                   state=state)
    log.info("averaged %d checkpoints (%s) into %s", len(dirs),
             ", ".join(d.name for d in dirs), path)
    return path
