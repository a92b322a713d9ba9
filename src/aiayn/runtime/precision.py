"""Precisions: their names in configs and on command lines, and the choice ``auto`` makes for
training (``train.dtype``) and for inference (``--dtype``) on each device.

The CPU's facts are read as attributes of :mod:`aiayn.runtime.cpu` (``cpu.cpu_flags()``), so
that a test stubs each of them in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiayn.errors import ConfigError
from aiayn.runtime import cpu
from aiayn.runtime.devices import cuda_fp16_tensor_cores, cuda_native_bf16

if TYPE_CHECKING:  # torch is imported lazily: the allocator is tuned before it loads
    import torch


def native_bf16(device: torch.device | str) -> bool:
    """Whether bfloat16 matmuls run on dedicated hardware on ``device``: on a CPU, bf16 units
    (:func:`aiayn.runtime.cpu.cpu_native_bf16`); on a CUDA GPU, compute capability 8.0 and
    later (:func:`aiayn.runtime.devices.cuda_native_bf16`). Where bf16 is emulated it is
    *slower* than float32, so ``dtype: auto`` picks float32 there."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return cuda_native_bf16(device)
    return device.type == "cpu" and cpu.cpu_native_bf16()


def resolve_train_dtype(dtype: str, device: torch.device | str) -> str:
    """``train.dtype`` with ``auto`` resolved: bf16 where it is native; on a CUDA GPU without
    it but with fp16 tensor cores (:func:`~aiayn.runtime.devices.cuda_fp16_tensor_cores`), fp16
    (trained with the gradient scaler); else fp32."""
    if dtype != "auto":
        return dtype
    if native_bf16(device):
        return "bf16"
    return "fp16" if cuda_fp16_tensor_cores(device) else "fp32"


# Precision names of configs and command lines -> torch dtypes (None: float32 as stored).
TORCH_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
                "fp16": "float16", "float16": "float16"}


def torch_dtype(name: str) -> torch.dtype | None:
    """'fp32' -> None (weights stay as trained), 'bf16' -> torch.bfloat16, 'fp16' -> torch.float16."""
    import torch

    resolved = TORCH_DTYPES[name]
    return None if resolved == "float32" else getattr(torch, resolved)


# The precisions inference runs in (`--dtype`), besides "auto".
INFERENCE_PRECISIONS = ("fp32", "bf16", "fp16", "int8")
DTYPE_ENV = "AIAYN_DTYPE"


@dataclass(frozen=True)
class DtypeChoice:
    """The precision inference runs in, and why: ``reason`` names the hardware feature that
    made ``auto`` choose it, or where an explicit choice came from; ``caveat``, for an explicit
    choice that is slow on this device, says so."""

    dtype: str  # fp32 | bf16 | fp16 | int8
    reason: str
    auto: bool = True  # chosen for "auto" (else given explicitly)
    caveat: str = ""

    def describe(self) -> str:
        """One line for the commands to print, e.g. ``dtype auto -> int8 (AVX-512 VNNI)``."""
        if self.auto:
            return f"dtype auto -> {self.dtype} ({self.reason})"
        return f"dtype {self.dtype}: {self.caveat}" if self.caveat else f"dtype {self.dtype}"


# `--dtype auto` on a CPU, by kind: the first row whose flags the CPU has (any of them) decides,
# where oneDNN's int8 kernel runs. Measured per kind in docs/results.md ("Precision per CPU
# kind"): with int8 dot products (VNNI, AMX) int8 is the fastest precision. Without them, bf16
# where the CPU has bf16 units, else int8 again where fbgemm's kernel runs (AVX2 and later:
# faster than float32 one sentence at a time and in batches), else fp32.
CPU_AUTO_DTYPES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("amx_int8", "amx_tile"), "int8", "AMX"),
    (("avx512_vnni",), "int8", "AVX-512 VNNI"),
    (("avx_vnni",), "int8", "AVX-VNNI"),
)
# Instructions that multiply and add uint8 x int8 pairs into 32 bits (VNNI, AMX's tiles).
INT8_DOT_PRODUCTS = frozenset(flag for needs, _, _ in CPU_AUTO_DTYPES for flag in needs)


def int8_kernel(flags: frozenset[str] | set[str] | None = None) -> str:
    """The int8 linear kernel for this CPU (``flags``: default :func:`aiayn.runtime.cpu.cpu_flags`),
    as :mod:`aiayn.inference.quantize` names them: ``onednn`` where the CPU has int8 dot
    products, ``fbgemm`` where it has not but has AVX2 (its kernels are faster there:
    docs/results.md), the other of the two where one is missing, ``int_mm`` (a reference loop
    on most CPUs) where torch has neither."""
    flags = cpu.cpu_flags() if flags is None else flags
    onednn, fbgemm = cpu.onednn_int8(), cpu.fbgemm_int8() and "avx2" in flags
    if onednn and flags & INT8_DOT_PRODUCTS:
        return "onednn"
    if fbgemm:
        return "fbgemm"
    return "onednn" if onednn else "int_mm"


def auto_inference_dtype(device: torch.device | str = "cpu", flags: frozenset[str] | set[str] | None = None
                         ) -> DtypeChoice:
    """The fastest precision whose translations stay within the quality guard of float32
    (the slow Multi30k test) on ``device``; ``flags``: the CPU's (default
    :func:`aiayn.runtime.cpu.cpu_flags`).

    CPU: int8 (int8 weights, per-token int8 inputs: ``aiayn.inference.quantize``) on the kinds
    of :data:`CPU_AUTO_DTYPES`, those with int8 dot products; such an instruction does twice
    the multiply-adds of a bf16 one, and per-token scales keep BLEU with fp32's. Elsewhere (or
    where torch has no oneDNN int8 kernel) bf16 where the CPU has bf16 units, else int8 where
    fbgemm's kernel runs (:func:`int8_kernel`), else fp32. CUDA:
    bf16 where the GPU computes it natively, else fp16. Any other device: fp32.
    """
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        if cuda_native_bf16(device):
            return DtypeChoice("bf16", "CUDA, native bf16")
        return DtypeChoice("fp16", "CUDA, no native bf16")
    if device.type != "cpu":
        return DtypeChoice("fp32", f"{device.type}: fp32 only")
    flags = cpu.cpu_flags() if flags is None else flags
    kernel = int8_kernel(flags)
    if kernel == "onednn":
        for needs, dtype, reason in CPU_AUTO_DTYPES:
            if flags & set(needs):
                return DtypeChoice(dtype, reason)
    if "avx512_bf16" in flags:
        return DtypeChoice("bf16", "AVX-512 BF16")
    if "amx_bf16" in flags:
        return DtypeChoice("bf16", "AMX")
    if kernel == "fbgemm":
        return DtypeChoice("int8", "fbgemm's int8 kernel")
    return DtypeChoice("fp32", "no VNNI or bf16 units")


def _caveat(dtype: str, device: torch.device | str) -> str:
    """For an explicit ``--dtype`` that is slow here, why (one clause); else empty."""
    import torch

    if torch.device(device).type != "cpu":
        return ""
    if dtype == "bf16" and not cpu.cpu_native_bf16():
        return "bf16 is emulated on this CPU (no AVX-512 BF16 or AMX), slower than fp32"
    kernel = int8_kernel() if dtype == "int8" else ""
    if kernel == "int_mm":
        return "this torch has no oneDNN or fbgemm int8 kernel; int8 runs on a reference loop, slower than fp32"
    if kernel == "onednn" and not cpu.cpu_flags() & INT8_DOT_PRODUCTS:
        return ("this CPU has no VNNI or AMX: int8 runs with oneDNN's 7-bit weights, faster than fp32 in "
                "batches, slower one sentence at a time")
    return ""


def resolve_inference_dtype(dtype: str, device: torch.device | str = "cpu") -> DtypeChoice:
    """``--dtype`` (or ``dtype=`` of the Python API) resolved: an explicit precision as it is
    (with a caveat where it is slow on this device); ``auto``: ``$AIAYN_DTYPE`` if set (a
    precision for every command of a deployment, or of a test run), else
    :func:`auto_inference_dtype`. An unknown name is a :class:`~aiayn.errors.ConfigError`
    naming where it came from."""
    if dtype != "auto":
        if dtype not in INFERENCE_PRECISIONS:
            raise ConfigError(f"--dtype {dtype}: choose from auto, {', '.join(INFERENCE_PRECISIONS)}")
        return DtypeChoice(dtype, "as given", auto=False, caveat=_caveat(dtype, device))
    pinned = os.environ.get(DTYPE_ENV, "").strip()
    if pinned and pinned != "auto":
        if pinned not in INFERENCE_PRECISIONS:
            raise ConfigError(f"{DTYPE_ENV}={pinned!r}: choose from auto, {', '.join(INFERENCE_PRECISIONS)}")
        return DtypeChoice(pinned, f"${DTYPE_ENV}")
    return auto_inference_dtype(device)
