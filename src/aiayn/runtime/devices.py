"""Devices: the device a ``--device`` name means on this machine, and what a CUDA GPU computes
natively (the CPU's counterpart is :mod:`aiayn.runtime.cpu`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiayn.errors import ConfigError

if TYPE_CHECKING:  # torch is imported lazily: the allocator is tuned before it loads
    import torch


def resolve_device(preference: str | torch.device, local_rank: int = 0, field: str = "--device") -> torch.device:
    """``auto`` -> this rank's CUDA device if there is one, else the CPU; ``cuda`` (no index)
    -> this rank's GPU; anything else as torch names it. A device that does not exist or is
    not available is a :class:`~aiayn.errors.ConfigError` naming ``field``."""
    import torch

    name = str(preference)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{field} {name}: not a device (cpu, cuda, cuda:N, auto)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{field} {name}: CUDA is not available on this machine")
        index = local_rank % torch.cuda.device_count() if device.index is None else device.index
        return torch.device("cuda", index)
    return device


def cuda_native_bf16(device: torch.device | str = "cuda") -> bool:
    """Whether a CUDA device computes in bfloat16 on its tensor cores: compute capability 8.0
    and later (Ampere: A100, A10, RTX 30xx; Ada; Hopper: H100, H200). Older GPUs (V100, T4)
    hold bf16 tensors but emulate the arithmetic, and ``torch.cuda.is_bf16_supported()``
    still answers True there; fp16 with a gradient scaler is their reduced precision."""
    import torch

    if not torch.cuda.is_available():
        return False
    if torch.version.hip:  # every ROCm architecture torch supports has bf16
        return True
    return torch.cuda.get_device_properties(torch.device(device)).major >= 8


def cuda_fp16_tensor_cores(device: torch.device | str = "cuda") -> bool:
    """Whether ``device`` is a CUDA GPU with fp16 tensor cores: compute capability 7.0 and
    later (Volta: V100; Turing: T4, RTX 20xx; and everything since). Below it (Pascal and
    older) fp16 matmuls gain little or nothing over float32."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if torch.version.hip:
        return True
    return torch.cuda.get_device_properties(device).major >= 7
