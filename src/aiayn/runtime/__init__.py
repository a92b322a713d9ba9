"""What the process runs on and how: one module per concern, each name re-exported here.

- :mod:`~aiayn.runtime.process`: the memory allocator, torch's CPU threads, decoding worker
  processes, a passing thread for set-up work, a quick exit
- :mod:`~aiayn.runtime.cpu`: the CPU's instruction-set flags and kind, what it runs natively
- :mod:`~aiayn.runtime.devices`: the device a ``--device`` name means, what a CUDA GPU runs natively
- :mod:`~aiayn.runtime.precision`: precision names and the choice ``auto`` makes per device
- :mod:`~aiayn.runtime.compile_cache`: the folder compiled artifacts are kept in

No module imports torch at load time: ``aiayn`` tunes the allocator before torch loads. A test
that stubs one of these names stubs it in its submodule, where the code looks it up.
"""

from aiayn.runtime.compile_cache import CACHE_ENV, INDUCTOR_CACHE_ENV, compile_cache_dir, use_compile_cache
from aiayn.runtime.cpu import (
    CPU_KINDS,
    CPUINFO,
    ISA_NARROWING_ENV,
    ONEDNN_ISA_ENV,
    cpu_flags,
    cpu_kind,
    cpu_native_bf16,
    fbgemm_int8,
    narrowed_flags,
    onednn_int8,
)
from aiayn.runtime.devices import cuda_fp16_tensor_cores, cuda_native_bf16, resolve_device
from aiayn.runtime.precision import (
    CPU_AUTO_DTYPES,
    DTYPE_ENV,
    INFERENCE_PRECISIONS,
    INT8_DOT_PRODUCTS,
    TORCH_DTYPES,
    DtypeChoice,
    auto_inference_dtype,
    int8_kernel,
    native_bf16,
    resolve_inference_dtype,
    resolve_train_dtype,
    torch_dtype,
)
from aiayn.runtime.process import (
    MAX_AUTO_WORKERS,
    MIN_LINES_PER_WORKER,
    THREADS_ENV,
    decode_workers,
    exit_now,
    num_threads,
    on_a_passing_thread,
    set_threads,
    tune_allocator,
)

__all__ = [
    # process
    "MAX_AUTO_WORKERS", "MIN_LINES_PER_WORKER", "THREADS_ENV", "decode_workers", "exit_now", "num_threads",
    "on_a_passing_thread", "set_threads", "tune_allocator",
    # cpu
    "CPUINFO", "CPU_KINDS", "ISA_NARROWING_ENV", "ONEDNN_ISA_ENV", "cpu_flags", "cpu_kind", "cpu_native_bf16",
    "fbgemm_int8", "narrowed_flags", "onednn_int8",
    # devices
    "cuda_fp16_tensor_cores", "cuda_native_bf16", "resolve_device",
    # precision
    "CPU_AUTO_DTYPES", "DTYPE_ENV", "INFERENCE_PRECISIONS", "INT8_DOT_PRODUCTS", "TORCH_DTYPES", "DtypeChoice",
    "auto_inference_dtype", "int8_kernel", "native_bf16", "resolve_inference_dtype", "resolve_train_dtype",
    "torch_dtype",
    # compile_cache
    "CACHE_ENV", "INDUCTOR_CACHE_ENV", "compile_cache_dir", "use_compile_cache",
]
