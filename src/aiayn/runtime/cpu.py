"""What this CPU is and runs natively: its instruction-set flags (as oneDNN may use them), its
kind (the rows of the results page), bf16 units and oneDNN's int8 kernel.

Every precision choice reads the CPU through :func:`cpu_flags`."""

from __future__ import annotations

import functools
import os
from pathlib import Path

# x86 feature flags (named as Linux's /proc/cpuinfo names them) that torch probes on every OS.
_TORCH_CPU_PROBES = {"avx2": "_is_avx2_supported", "avx512f": "_is_avx512_supported",
                     "avx512_vnni": "_is_vnni_supported", "avx512_bf16": "_is_avx512_bf16_supported",
                     "amx_tile": "_is_amx_tile_supported", "amx_fp16": "_is_amx_fp16_supported"}
CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags, as Linux names them (``avx512_vnni``, ``amx_int8``, ...):
    what torch's probes report, plus the first ``flags`` line of /proc/cpuinfo where there is
    one (it names more: ``avx_vnni``, ``amx_int8``, ``amx_bf16``). Read once per process."""
    import torch

    flags = {name for name, probe in _TORCH_CPU_PROBES.items() if bool(getattr(torch.cpu, probe, lambda: False)())}
    try:
        with CPUINFO.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags.update(line.partition(":")[2].split())
                    break
    except OSError:  # not Linux: torch's probes alone
        pass
    return narrowed_flags(frozenset(flags), os.environ.get(ONEDNN_ISA_ENV, ""))


# oneDNN, which runs torch's CPU matmuls in every precision, uses no instruction set above
# $ONEDNN_MAX_CPU_ISA: the flags each of its levels (lower case) leaves out. A CPU narrowed
# this way behaves, for the precision choices, as the CPU kind it emulates.
ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"
_AVX512 = ("avx512",)  # every avx512* flag
_AMX = ("amx",)
_ONEDNN_ISA_DROPS: dict[str, tuple[str, ...]] = {
    "sse41": ("avx", "fma", "f16c") + _AVX512 + _AMX,
    "avx": ("avx2", "fma", "avx_vnni") + _AVX512 + _AMX,
    "avx2": ("avx_vnni",) + _AVX512 + _AMX,
    "avx2_vnni": _AVX512 + _AMX,
    "avx2_vnni_2": _AVX512 + _AMX,
    "avx512_core": ("avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni") + _AMX,
    "avx512_core_vnni": ("avx512_bf16", "avx512_fp16") + _AMX,
    "avx512_core_bf16": ("avx512_fp16",) + _AMX,
    "avx10_1_512": _AMX,
    "avx512_core_fp16": _AMX,
}


def narrowed_flags(flags: frozenset[str], max_isa: str) -> frozenset[str]:
    """``flags`` less what oneDNN may not use under ``ONEDNN_MAX_CPU_ISA=max_isa`` (e.g.
    ``AVX2``: no AVX-512, VNNI or AMX). An empty, unknown or AMX-level value leaves them."""
    drops = _ONEDNN_ISA_DROPS.get(max_isa.strip().lower(), ())
    return frozenset(f for f in flags if not f.startswith(drops)) if drops else flags


# The CPU kinds the results page has a table for, most capable first: (name, any of these flags).
CPU_KINDS = (("AMX", ("amx_tile", "amx_int8", "amx_bf16")), ("AVX-512 BF16", ("avx512_bf16",)),
             ("AVX-512 VNNI", ("avx512_vnni",)), ("AVX-VNNI", ("avx_vnni",)), ("AVX-512", ("avx512f",)),
             ("AVX2", ("avx2",)))
# Variables that narrow the instruction sets torch, oneDNN, MKL, fbgemm and CTranslate2 use: set, they make
# this CPU behave as a less capable kind (figures taken so are labelled emulated).
ISA_NARROWING_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                     "FBGEMM_ENABLE_INSTRUCTIONS", "CT2_FORCE_CPU_ISA")


def cpu_kind(flags: frozenset[str] | set[str] | None = None) -> str:
    """This CPU's kind, by its most capable matrix instructions (``flags``: default
    :func:`cpu_flags`, narrowed by ``ONEDNN_MAX_CPU_ISA``): ``AMX``, ``AVX-512 BF16``,
    ``AVX-512 VNNI``, ``AVX-VNNI``, ``AVX-512``, ``AVX2`` or ``other``; `` (emulated: VAR=VALUE ...)``
    follows where a variable of :data:`ISA_NARROWING_ENV` is set."""
    flags = cpu_flags() if flags is None else flags
    kind = next((name for name, needs in CPU_KINDS if flags & set(needs)), "other")
    narrowing = " ".join(f"{k}={os.environ[k]}" for k in ISA_NARROWING_ENV if os.environ.get(k))
    return f"{kind} (emulated: {narrowing})" if narrowing else kind


def cpu_native_bf16(flags: frozenset[str] | set[str] | None = None) -> bool:
    """Whether this CPU (``flags``: default :func:`cpu_flags`) has bf16 units: AVX-512 BF16 or
    AMX tiles. There a bf16 matmul is faster than a float32 one; without them torch emulates
    bf16 with float32 arithmetic plus conversions, slower than float32."""
    flags = cpu_flags() if flags is None else flags
    return bool({"avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"} & flags)


def onednn_int8() -> bool:
    """Whether torch has oneDNN's int8 linear (x86 builds): without it int8 runs on a reference loop."""
    import torch

    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


def fbgemm_int8() -> bool:
    """Whether torch has fbgemm's int8 linear over float inputs with given scales (x86 builds)."""
    import torch

    return ("fbgemm" in torch.backends.quantized.supported_engines
            and hasattr(torch.ops.quantized, "linear_with_input_q_dq_qweight_dq_output_fp32"))

