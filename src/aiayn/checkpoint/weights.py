"""Model weights in safetensors: what a checkpoint's ``model.safetensors`` holds, read
back strictly (every name, shape and floating dtype the model's; no NaN or infinite value).

Tied matrices are stored once, their other names kept as aliases in the file's metadata;
names carry no ``module.`` (DistributedDataParallel) or ``_orig_mod.`` (torch.compile) prefix.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from aiayn.checkpoint.layout import FORMAT_VERSION
from aiayn.errors import CheckpointError

_PREFIXES = ("module.", "_orig_mod.")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DistributedDataParallel and/or torch.compile wrappers."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def _strip_prefixes(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
                changed = True
    return name


def model_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """CPU tensors to save, each storage once, and ``alias -> saved name`` for tied ones."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for raw_name, t in unwrap_model(model).state_dict().items():
        name = _strip_prefixes(raw_name)
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
               tuple(t.stride()), t.dtype)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().to("cpu").contiguous()
    return tensors, aliases


def save_model_weights(model: nn.Module, path: str | Path) -> None:
    tensors, aliases = model_tensors(model)
    metadata = {"format": "pt", "aiayn_format_version": str(FORMAT_VERSION),
                "aliases": json.dumps(aliases, sort_keys=True)}
    save_file(tensors, str(path), metadata=metadata)


# The random fills that initialization draws, as torch.nn.init and the modules' own
# reset_parameters call them (the functions of torch.nn.init that do not dispatch on their own
# end in one of the two tensor methods).
_RANDOM_FILLS: frozenset[Callable[..., Any]] = frozenset({
    nn.init.uniform_, nn.init.normal_, nn.init.kaiming_uniform_, Tensor.uniform_, Tensor.normal_})


class _NoRandomFills(TorchFunctionMode):
    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if func in _RANDOM_FILLS:
            return args[0] if args else (kwargs or {})["tensor"]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def without_random_init() -> Iterator[None]:
    """Modules built inside keep their parameters uninitialized: the random initialization's
    fills are skipped (on this thread only; the global random generator is not advanced).
    For a model whose every parameter is then loaded (:func:`load_model_weights` is strict):
    drawing values only to overwrite them costs about as long as reading the weights."""
    with _NoRandomFills():
        yield


def read_model_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """All weight names (aliases included, sharing one tensor) from a model.safetensors."""
    path = Path(path)
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            metadata = f.metadata() or {}
        tensors = load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read weights: {exc}") from None
    try:
        aliases = json.loads(metadata.get("aliases", "{}"))
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: corrupt 'aliases' metadata") from None
    for alias, target in aliases.items():
        if target not in tensors:
            raise CheckpointError(f"{path}: alias {alias!r} points to missing tensor {target!r}")
        tensors[alias] = tensors[target]
    for name, t in tensors.items():
        # NaN weights (a diverged run) would decode to empty translations without an error.
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: {name} holds NaN or infinite values (a diverged run?); "
                                  "use another checkpoint")
    return {_strip_prefixes(k): v for k, v in tensors.items()}


def load_model_weights(model: nn.Module, path: str | Path) -> None:
    """Load a model.safetensors into ``model`` (strict: every name must match)."""
    load_model_tensors(model, read_model_weights(path), path)


def load_model_tensors(model: nn.Module, tensors: dict[str, Tensor], path: str | Path) -> None:
    """Load ``tensors`` (read from ``path``, which errors name) into ``model``: every name,
    shape and floating dtype must be the model's."""
    model = unwrap_model(model)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the model built from the config "
            f"(missing: {missing[:5]}{'...' if len(missing) > 5 else ''}; "
            f"unexpected: {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})")
    for name, t in tensors.items():
        _check_tensor(path, name, t, expected[name])
    model.load_state_dict(tensors, strict=True)


def _check_tensor(path: str | Path, name: str, t: Tensor, expected: Tensor) -> None:
    """The shape the config implies and a floating dtype where the model has one (a header
    edited from F32 to I32 would otherwise be cast silently)."""
    if tuple(t.shape) != tuple(expected.shape):
        raise CheckpointError(f"{path}: {name} has shape {tuple(t.shape)}, the config "
                              f"gives {tuple(expected.shape)}")
    if t.is_floating_point() != expected.is_floating_point():
        raise CheckpointError(f"{path}: {name} has dtype {str(t.dtype).removeprefix('torch.')}, "
                              f"the model needs {str(expected.dtype).removeprefix('torch.')}")

