"""Mixed precision for training: autocast, the fp16 gradient scaler, and the guarded update.

bf16 needs no scaler (its exponent range is fp32's); fp16 does, and only CUDA has one that
the optimizer update can rely on. Master weights and optimizer state stay fp32 either way.
``train.dtype: auto`` (:func:`aiayn.runtime.precision.resolve_train_dtype`) gives bf16 where the device
computes it natively and fp16, with the scaler, on CUDA GPUs that have fp16 tensor cores
but no native bf16 (Volta, Turing).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from aiayn.errors import ConfigError


def check_fp16_device(dtype: str, device: torch.device) -> None:
    if dtype == "fp16" and device.type != "cuda":
        raise ConfigError("train.dtype: fp16 needs a CUDA device (it relies on a gradient "
                          "scaler); use bf16 on CPU")


def autocast(device: torch.device, amp_dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    if amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


def grad_scaler(dtype: str, device: torch.device) -> torch.amp.GradScaler:
    """A scaler that is a no-op unless ``dtype`` is fp16."""
    return torch.amp.GradScaler(device.type, enabled=dtype == "fp16")


def dtype_label(configured: str, resolved: str) -> str:
    """For the start-of-run log line: what train.dtype resolved to, and why."""
    if configured != "auto":
        return resolved
    why = {"bf16": "native bf16", "fp16": "no native bf16 on this GPU, fp16 tensor cores, a gradient scaler"}.get(
        resolved, "no native bf16 on this device")
    return f"dtype auto -> {resolved}: {why}"


def grad_norm(params: Sequence[torch.Tensor], clip_norm: float, device: torch.device) -> torch.Tensor:
    """The total gradient norm, after clipping it to ``clip_norm`` (0: no clipping)."""
    grads = [p.grad for p in params if p.grad is not None]
    if clip_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, clip_norm)
    if not grads:
        return torch.zeros((), device=device)
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


@dataclass
class UpdateOutcome:
    grad_norm: float
    updated: bool  # False: skipped (non-finite loss/gradient, or an fp16 overflow)
    nonfinite: bool  # the loss or gradient was NaN/inf
    overflow: bool = False  # fp16: a finite loss whose gradients overflowed
    scale_before: float = 0.0  # fp16: the loss scale the gradients were computed with


def apply_update(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, params: Sequence[torch.Tensor],
                 clip_norm: float, loss_ok: bool, device: torch.device) -> UpdateOutcome:
    """One optimizer step from the accumulated (scaled) gradients, skipped when the loss
    or a gradient is not finite: one bad batch must not destroy the weights."""
    if scaler.is_enabled():
        scaler.unscale_(optimizer)
        norm = float(grad_norm(params, clip_norm, device))
        scale_before = scaler.get_scale()
        scaler.step(optimizer)  # skips the update itself on inf/NaN gradients
        scaler.update()
        updated = loss_ok and scaler.get_scale() >= scale_before
        return UpdateOutcome(norm, updated, nonfinite=not loss_ok, overflow=loss_ok and not updated,
                             scale_before=scale_before)
    norm = float(grad_norm(params, clip_norm, device))
    nonfinite = not (loss_ok and math.isfinite(norm))
    if not nonfinite:
        optimizer.step()
    return UpdateOutcome(norm, updated=not nonfinite, nonfinite=nonfinite)
