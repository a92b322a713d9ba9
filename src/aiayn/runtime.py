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

import concurrent.futures
import ctypes
import ctypes.util
import functools
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

from aiayn.errors import ConfigError

if TYPE_CHECKING:  # torch is imported lazily: the allocator is tuned before it loads
    import torch

log = logging.getLogger(__name__)

T = TypeVar("T")

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


# x86 feature flags (named as Linux's /proc/cpuinfo names them) that torch probes on every OS.
_TORCH_CPU_PROBES = {"avx2": "_is_avx2_supported", "avx512f": "_is_avx512_supported",
                     "avx512_vnni": "_is_vnni_supported", "avx512_bf16": "_is_avx512_bf16_supported",
                     "amx_tile": "_is_amx_tile_supported", "amx_fp16": "_is_amx_fp16_supported"}
CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags, as Linux names them (``avx512_vnni``, ``amx_int8``, ...):
    what torch's probes report, plus the first ``flags`` line of /proc/cpuinfo where there is
    one (it names more: ``avx_vnni``, ``amx_int8``, ``amx_bf16``). Read once per process; the
    precision choices below all read the CPU through this function."""
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
# this way behaves, for the precision choices below, as the CPU kind it emulates.
ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"
_AVX512 = ("avx512",)  # every avx512* flag
_AMX = ("amx",)
_ONEDNN_ISA_DROPS: dict[str, tuple[str, ...]] = {
    "sse41": ("avx", "fma", "f16c") + _AVX512 + _AMX,
    "avx": ("avx2", "fma") + _AVX512 + _AMX,
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
# Variables that narrow the instruction sets torch, oneDNN, MKL and CTranslate2 use: set, they make
# this CPU behave as a less capable kind (figures taken so are labelled emulated).
ISA_NARROWING_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "CT2_FORCE_CPU_ISA")


def cpu_kind(flags: frozenset[str] | set[str] | None = None) -> str:
    """This CPU's kind, by its most capable matrix instructions (``flags``: default
    :func:`cpu_flags`, narrowed by ``ONEDNN_MAX_CPU_ISA``): ``AMX``, ``AVX-512 BF16``,
    ``AVX-512 VNNI``, ``AVX-VNNI``, ``AVX-512``, ``AVX2`` or ``other``; `` (emulated: VAR=VALUE ...)``
    follows where a variable of :data:`ISA_NARROWING_ENV` is set."""
    flags = cpu_flags() if flags is None else flags
    kind = next((name for name, needs in CPU_KINDS if flags & set(needs)), "other")
    narrowing = " ".join(f"{k}={os.environ[k]}" for k in ISA_NARROWING_ENV if os.environ.get(k))
    return f"{kind} (emulated: {narrowing})" if narrowing else kind


def _amx(flags: frozenset[str] | set[str]) -> bool:
    return bool({"amx_tile", "amx_int8", "amx_bf16"} & flags)


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
    flags = cpu_flags()
    return "avx512_bf16" in flags or _amx(flags)


def resolve_train_dtype(dtype: str, device: torch.device | str) -> str:
    """``train.dtype`` with ``auto`` resolved: bf16 where it is native; on a CUDA GPU without
    it but with fp16 tensor cores (:func:`cuda_fp16_tensor_cores`), fp16 (trained with the
    gradient scaler); else fp32."""
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


# `--dtype auto` on a CPU, by kind: the first row whose flags the CPU has (any of them) decides.
# Measured per kind in docs/results.md ("Precision per CPU kind"): with int8 dot products (VNNI,
# AMX) int8 is the fastest precision. Without them oneDNN's int8 matmul needs 7-bit weights
# (aiayn.inference.quantize) and decodes at about float32's speed, not faster: fp32 there, and
# bf16 wins only where int8 cannot run.
CPU_AUTO_DTYPES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("amx_int8", "amx_tile"), "int8", "AMX"),
    (("avx512_vnni",), "int8", "AVX-512 VNNI"),
    (("avx_vnni",), "int8", "AVX-VNNI"),
)
INT8_DOT_PRODUCTS = frozenset(flag for needs, _, _ in CPU_AUTO_DTYPES for flag in needs)


def onednn_int8() -> bool:
    """Whether torch has oneDNN's int8 linear (x86 builds): without it int8 runs on a reference loop."""
    import torch

    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")


def auto_inference_dtype(device: torch.device | str = "cpu", flags: frozenset[str] | set[str] | None = None
                         ) -> DtypeChoice:
    """The fastest precision whose translations stay within the quality guard of float32
    (the slow Multi30k test) on ``device``; ``flags``: the CPU's (default :func:`cpu_flags`).

    CPU: int8 (int8 weights, per-token int8 inputs: ``aiayn.inference.quantize``) on the kinds
    of :data:`CPU_AUTO_DTYPES`, those with int8 dot products; such an instruction does twice
    the multiply-adds of a bf16 one, and per-token scales keep BLEU with fp32's. Elsewhere (or
    where torch has no oneDNN int8 kernel) bf16 where the CPU has bf16 units, else fp32. CUDA:
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
    flags = cpu_flags() if flags is None else flags
    if onednn_int8():
        for needs, dtype, reason in CPU_AUTO_DTYPES:
            if flags & set(needs):
                return DtypeChoice(dtype, reason)
    if "avx512_bf16" in flags:
        return DtypeChoice("bf16", "AVX-512 BF16")
    if "amx_bf16" in flags:
        return DtypeChoice("bf16", "AMX")
    return DtypeChoice("fp32", "no VNNI or bf16 units")


def _caveat(dtype: str, device: torch.device | str) -> str:
    """For an explicit ``--dtype`` that is slow here, why (one clause); else empty."""
    import torch

    if torch.device(device).type != "cpu":
        return ""
    if dtype == "bf16" and not native_bf16("cpu"):
        return "bf16 is emulated on this CPU (no AVX-512 BF16 or AMX), slower than fp32"
    if dtype == "int8" and not onednn_int8():
        return "this torch has no oneDNN int8 kernel; int8 runs on a reference loop, slower than fp32"
    if dtype == "int8" and not cpu_flags() & INT8_DOT_PRODUCTS:
        return "this CPU has no VNNI or AMX: int8 runs with 7-bit weights, no faster than fp32"
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


CACHE_ENV = "AIAYN_CACHE_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache_dir() -> Path:
    """Where compiled artifacts are kept between runs: ``$TORCHINDUCTOR_CACHE_DIR`` if set,
    else ``inductor/torch-<version>`` under ``$AIAYN_CACHE_DIR`` (default ~/.cache/aiayn).
    It holds inductor's own caches (C++ kernels; FX graphs, keyed by the graph, the torch
    version and the CPU's instruction set) and, under ``aoti/``, the compiled decoding steps
    (:mod:`aiayn.inference.step_packages`); the folder per torch version lets an upgrade
    leave the old entries behind as a whole."""
    import torch

    given = os.environ.get(INDUCTOR_CACHE_ENV)
    if given and given != _inductor_default_cache_dir():  # inductor writes its default there too
        return Path(given)
    root = os.environ.get(CACHE_ENV)
    base = Path(root) if root else Path.home() / ".cache" / "aiayn"
    return base / "inductor" / f"torch-{torch.__version__.replace('+', '-')}"


def _inductor_default_cache_dir() -> str | None:
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch layout: take the variable as given
        return None
    return os.path.abspath(default_cache_dir())


def use_compile_cache() -> Path:
    """Point inductor's caches at :func:`compile_cache_dir` (it reads the variable when it
    compiles) and turn its FX graph cache on, so that a process compiling a graph some
    earlier run compiled loads it instead; returns the folder. Call before compiling."""
    import torch._inductor.config as inductor_config

    folder = compile_cache_dir()
    os.environ[INDUCTOR_CACHE_ENV] = str(folder)
    inductor_config.fx_graph_cache = True
    return folder


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


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once standard output, standard error and the logging
    handlers are flushed, skipping the interpreter's teardown. With torch loaded, that teardown
    (finalizers, the collection of torch's many objects) costs a visible share of a short
    command's time (docs/results.md). For a command line whose outputs are complete and closed,
    with no thread or child process left to wait for."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)


def on_a_passing_thread(work: Callable[[], T]) -> T:
    """Run ``work`` on a thread of its own that ends when it returns: its result here, or its
    exception raised here.

    For work done once before another thread takes over the model (a server loads and
    compiles it, then its batcher's thread decodes). libgomp, the OpenMP of torch's x86
    builds, gives each thread that runs parallel work a team of helper threads that lives as
    long as that thread. Once the helpers of all teams outnumber the cores, every team stops
    spinning between parallel regions and sleeps instead, and each of a decoding step's
    hundreds of small ops waits for its helpers to wake (one sentence took twice as long on
    2 cores). A thread that ends takes its team with it.
    """
    # Leaving the pool's block joins its one worker thread: the thread has ended on return.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="aiayn-setup") as pool:
        return pool.submit(work).result()


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
