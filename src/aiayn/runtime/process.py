"""Process-wide settings, applied by the `aiayn` command: the memory allocator, torch's CPU
threads and how many decoding worker processes share them, a thread for set-up work, and a
quick exit.

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
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

from aiayn.errors import ConfigError

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


# A decode runs its batches in worker processes only where each worker gets this many lines:
# below it the processes' start and hand-offs are not won back.
MIN_LINES_PER_WORKER = 64
# Each worker holds its own search state (caches, scores) for a batch: auto starts no more than
# this many, sharing the threads among them.
MAX_AUTO_WORKERS = 8


def decode_workers(requested: str, device_type: str, threads: int, lines: int | None) -> tuple[int, int]:
    """(worker processes, torch threads each) for decoding ``lines`` lines (None: a stream)
    with ``threads`` threads on a ``device_type`` device. ``requested``: a number, or ``auto``:
    on a CPU, one worker per thread (at most :data:`MAX_AUTO_WORKERS`, the threads shared
    among them) for a file of at least :data:`MIN_LINES_PER_WORKER` lines per worker; else (a
    GPU, a stream, one thread, few lines) one, which decodes in the process itself. A number
    splits the threads among the workers (at least one each)."""
    if requested != "auto":
        try:
            workers = int(requested)
        except ValueError:
            raise ConfigError(f"--workers {requested!r}: give auto or a whole number of processes") from None
        if workers < 1:
            raise ConfigError(f"--workers {workers}: at least 1 (1 decodes in this process)")
        return workers, max(1, threads // workers)
    if device_type != "cpu" or lines is None or threads < 2:
        return 1, threads
    workers = min(threads, MAX_AUTO_WORKERS, lines // MIN_LINES_PER_WORKER)
    return (workers, threads // workers) if workers >= 2 else (1, threads)


def on_a_passing_thread(work: Callable[[], T]) -> T:
    """Run ``work`` on a thread of its own that ends when it returns: its result here, or its
    exception raised here.

    For work done once before another thread takes over the model (a server loads and
    compiles it, then its batcher's thread decodes). libgomp, the OpenMP of torch's x86
    builds, gives each thread that runs parallel work a team of helper threads that lives as
    long as that thread. Once the helpers of all teams outnumber the cores, every team stops
    spinning between parallel regions and sleeps instead, and each of a decoding step's
    hundreds of small ops waits for its helpers to wake (docs/serving.md). A thread that ends
    takes its team with it.
    """
    # Leaving the pool's block joins its one worker thread: the thread has ended on return.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="aiayn-setup") as pool:
        return pool.submit(work).result()


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
