"""Training state beside the weights: the optimizer's state (``optimizer.safetensors`` for
its tensors, ``optimizer.json`` for the rest) and the random generators' states (JSON-safe,
for ``state.json``), so that a resumed run continues the interrupted one."""

from __future__ import annotations

import base64
import json
import logging
import random
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from aiayn.checkpoint.layout import FORMAT_VERSION, OPTIMIZER_FILE, OPTIMIZER_JSON
from aiayn.errors import CheckpointError

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------- optimizer


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, Tensor):
        return value.item()
    return value


def save_optimizer(optimizer: torch.optim.Optimizer | dict, directory: Path) -> None:
    """Optimizer tensors to optimizer.safetensors, everything else to optimizer.json."""
    sd = optimizer.state_dict() if not isinstance(optimizer, dict) else optimizer
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, pstate in sd["state"].items():
        for key, value in pstate.items():
            if isinstance(value, Tensor):
                tensors[f"state.{pid}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = _jsonable(value)
    meta = {"format_version": FORMAT_VERSION, "param_groups": _jsonable(sd["param_groups"]),
            "scalars": scalars, "param_ids": [str(p) for p in sd["state"]]}
    save_file(tensors, str(directory / OPTIMIZER_FILE), metadata={"format": "pt"})
    (directory / OPTIMIZER_JSON).write_text(json.dumps(meta, indent=1), encoding="utf-8")


def load_optimizer_state(directory: str | Path) -> dict[str, Any]:
    """An optimizer state dict (tensors on CPU) for ``optimizer.load_state_dict``."""
    directory = Path(directory)
    if not (directory / OPTIMIZER_FILE).is_file() or not (directory / OPTIMIZER_JSON).is_file():
        raise CheckpointError(f"{directory}: no optimizer state in this checkpoint "
                              f"({OPTIMIZER_FILE} / {OPTIMIZER_JSON} missing)")
    try:
        meta = json.loads((directory / OPTIMIZER_JSON).read_text(encoding="utf-8"))
        tensors = load_file(str(directory / OPTIMIZER_FILE))
    except (json.JSONDecodeError, SafetensorError, OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{directory}: cannot read the optimizer state: {exc}") from None
    try:
        return _optimizer_state(meta, tensors)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{directory / OPTIMIZER_JSON}: malformed optimizer state "
                              f"({type(exc).__name__}: {exc})") from None


def _optimizer_state(meta: dict[str, Any], tensors: dict[str, Tensor]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(p): {} for p in meta.get("param_ids", [])}
    for name, t in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = t
    for pid, values in meta.get("scalars", {}).items():
        state.setdefault(int(pid), {}).update(values)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    return {"state": state, "param_groups": groups}


def restore_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load ``state`` but keep this optimizer's kernel choice (fused/foreach), which
    depends on the device it now runs on, not the one that saved it."""
    keep = ("fused", "foreach", "capturable", "differentiable")
    groups = []
    for saved, current in zip(state["param_groups"], optimizer.param_groups):
        g = dict(saved)
        for k in keep:
            if k in current:
                g[k] = current[k]
        groups.append(g)
    if len(state["param_groups"]) != len(optimizer.param_groups):
        raise CheckpointError("optimizer state has a different number of parameter groups")
    try:
        optimizer.load_state_dict({"state": state["state"], "param_groups": groups})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"optimizer state does not fit this model: {exc}") from None


# ------------------------------------------------------------------------------ RNG


def _tensor_to_base64(t: Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _tensor_from_base64(s: str) -> Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng_state(device: torch.device | str | None = None) -> dict[str, Any]:
    """Python, NumPy and torch generator states as JSON-safe values.

    With a CUDA ``device``, that device's generator too (the one dropout uses there); only
    that one, so that a rank of a multi-GPU run does not touch the other GPUs.
    """
    py = random.getstate()
    # numpy's stub types this default (legacy=True) call as the dict form; it is the tuple
    # (kind, key, pos, has_gauss, cached_gaussian).
    np_state = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    state: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": {"kind": np_state[0], "key": np_state[1].tolist(), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": _tensor_to_base64(torch.get_rng_state()),
    }
    if device is not None and torch.device(device).type == "cuda":
        state["cuda"] = _tensor_to_base64(torch.cuda.get_rng_state(torch.device(device)))
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device | str | None = None) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["key"], dtype=np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(_tensor_from_base64(state["torch"]))
    if device is not None and torch.device(device).type == "cuda":
        if "cuda" in state:
            torch.cuda.set_rng_state(_tensor_from_base64(state["cuda"]), torch.device(device))
        else:
            log.warning("checkpoint has no CUDA RNG state (saved on CPU): dropout on this GPU "
                        "will not repeat the interrupted run exactly")

