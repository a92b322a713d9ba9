"""Process-wide settings that make the CPU code paths fast, applied by the `aiayn` command.

Memory allocator. With glibc's defaults every allocation above a threshold (at most 32 MB)
is served by a fresh ``mmap`` and returned with ``munmap`` when freed. A training step
allocates and frees many such tensors (a 4,096 x 2,048 float32 activation is 32 MB, the
float32 logits 0.5 GB), so each one is page-faulted in and zero-filled by the kernel again
at every step, a cost that memory-bound operations (an activation, a log-softmax over the
logits) pay in full, often more than the operation itself. Setting
``M_MMAP_MAX`` to 0 serves those tensors from the heap, where freed blocks are reused, and a
high ``M_TRIM_THRESHOLD`` keeps the heap from being handed back and faulted in again. This
is what the usual advice (jemalloc or tcmalloc via ``LD_PRELOAD``) achieves, without a
library to install. The cost: memory freed by a large tensor stays with the process.

Set ``AIAYN_MALLOC=system`` to keep the C library's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from typing import TYPE_CHECKING

from aiayn.errors import ConfigError

if TYPE_CHECKING:  # torch is imported lazily: the allocator is tuned before it loads
    import torch

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_THRESHOLD = 1 << 30  # keep up to 1 GB of free heap instead of returning it
_applied: bool | None = None


def tune_allocator() -> bool:
    """Apply the allocator settings above once per process; True when they are in effect."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("AIAYN_MALLOC", "").lower() == "system" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    log.debug("glibc allocator: mmap disabled for large blocks: %s", _applied)
    return _applied


def native_bf16(device: torch.device | str) -> bool:
    """Whether bfloat16 matmuls run on dedicated hardware on ``device``.

    On a CPU that means AVX-512 BF16 or AMX tiles: there a bf16 matmul is faster than a
    float32 one. Without them torch emulates bf16 with float32 arithmetic plus conversions,
    which makes bf16 *slower* than float32, so ``dtype: auto`` picks float32 there.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return cuda_native_bf16(device)
    if device.type != "cpu":
        return False
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_train_dtype(dtype: str, device: torch.device | str) -> str:
    """``train.dtype`` with ``auto`` resolved: bf16 where it is native, else fp32."""
    if dtype != "auto":
        return dtype
    return "bf16" if native_bf16(device) else "fp32"


# Precision names of configs and command lines -> torch dtypes (None: float32 as stored).
TORCH_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
                "fp16": "float16", "float16": "float16"}


def torch_dtype(name: str) -> torch.dtype | None:
    """'fp32' -> None (weights stay as trained), 'bf16' -> torch.bfloat16, 'fp16' -> torch.float16."""
    import torch

    resolved = TORCH_DTYPES[name]
    return None if resolved == "float32" else getattr(torch, resolved)


THREADS_ENV = "AIAYN_NUM_THREADS"


def num_threads(requested: int | None = None, field: str = "--threads") -> int:
    """The CPU threads torch should use: ``requested`` (a ``--threads`` flag), else
    ``$AIAYN_NUM_THREADS``, else 0 (leave torch's choice, one per core). A negative or
    non-numeric value is a :class:`~aiayn.errors.ConfigError` naming where it came from."""
    if requested is None:
        raw = os.environ.get(THREADS_ENV, "").strip()
        if not raw:
            return 0
        field = THREADS_ENV
        try:
            requested = int(raw)
        except ValueError:
            raise ConfigError(f"{THREADS_ENV}={raw!r}: not a whole number of threads") from None
    if requested < 0:
        raise ConfigError(f"{field} {requested}: the number of threads cannot be negative (0: torch's choice)")
    return requested


def set_threads(requested: int | None = None, field: str = "--threads") -> int:
    """Apply :func:`num_threads` to torch (0 leaves torch's default); returns the number.
    On a machine busy with other work, fewer threads than cores often run faster."""
    threads = num_threads(requested, field)
    if threads:
        import torch

        torch.set_num_threads(threads)
    return threads


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
