"""Getting training batches to the device: pinned host memory, non-blocking copies, and a
thread that prepares the next batches while the device computes.

On a CUDA device a batch's tensors are copied from page-locked ("pinned") host memory with
``non_blocking=True``: the copy is queued on the device's stream and the host goes on at
once, where a copy from ordinary (pageable) memory waits for the transfer. With
``data.prefetch_batches`` above 0, a background thread gathers, collates and pins the next
batches of the epoch (at most that many ahead) while the model computes; the training loop
takes them in the same order as without it, and the iterator's position counts the batches
handed to the loop, not those prepared ahead, so a checkpoint resumes exactly.

On a CPU nothing is pinned (page-locking needs CUDA) and, by default, nothing is prefetched:
the thread would take a core from the compute threads. :func:`host_transfer` makes all these
choices from the device, here only.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

# Batches prepared ahead by default: on a CUDA device, enough to hide one slow batch; on a
# CPU none (the loader would compete with the model for the same cores).
CUDA_PREFETCH = 2
CPU_PREFETCH = 0

# Seconds close() waits for the thread to finish the batch it is preparing (it is a daemon
# thread: one that is still busy then never holds up the interpreter's exit).
CLOSE_TIMEOUT = 30.0

T = TypeVar("T")


@dataclass(frozen=True)
class HostTransfer:
    """How training batches travel from the loader to ``device``."""

    device: torch.device
    pin_memory: bool  # collated tensors are page-locked (CUDA only)
    non_blocking: bool  # the copy to the device is asynchronous (from pinned memory)
    prefetch: int  # batches a background thread prepares ahead (0: none, in the loop)

    def to_device(self, batch: Any) -> Any:
        """``batch`` (anything with ``to(device, non_blocking=...)``) on the device."""
        return batch.to(self.device, non_blocking=self.non_blocking)


def host_transfer(device: torch.device | str, prefetch_batches: int | None = None) -> HostTransfer:
    """The loader's choices for ``device``: pinned memory and non-blocking copies on CUDA,
    neither elsewhere; ``prefetch_batches`` (``data.prefetch_batches``; None: by device)
    batches prepared ahead, by default ``CUDA_PREFETCH`` on CUDA and ``CPU_PREFETCH`` elsewhere."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    if prefetch_batches is None:
        prefetch_batches = CUDA_PREFETCH if cuda else CPU_PREFETCH
    if prefetch_batches < 0:
        raise ValueError(f"prefetch_batches must not be negative, got {prefetch_batches}")
    return HostTransfer(device=device, pin_memory=cuda, non_blocking=cuda, prefetch=int(prefetch_batches))


def pinned(batch: Any, device: torch.device) -> Any:
    """``batch.pin_memory()``, with ``device`` the calling thread's current CUDA device, so
    that a background thread never sets up a context on another GPU."""
    with torch.cuda.device(device):
        return batch.pin_memory()


_ITEM, _END, _ERROR = range(3)

# Prefetchers whose thread may still run: closed at interpreter exit, so that no thread is
# left copying into pinned memory while CUDA shuts down.
_open: weakref.WeakSet[Prefetcher[Any]] = weakref.WeakSet()


@atexit.register
def _close_open_prefetchers() -> None:
    for prefetcher in list(_open):
        prefetcher.close()


class Prefetcher(Generic[T]):
    """Iterates ``source`` in a daemon thread, at most ``depth`` items ahead of the consumer.

    ``for item in Prefetcher(source, depth)`` gives what ``for item in source`` gives, in the
    same order. An exception raised by ``source`` is raised again, the same object (message
    and traceback), by the consumer's ``next()`` at the place of the item it replaced.
    :meth:`close` (also on leaving a ``with`` block) stops the thread early; the items it
    prepared are dropped. One never closed stops at interpreter exit; its thread is a daemon
    thread, which never holds up the exit.
    """

    def __init__(self, source: Iterable[T], depth: int, name: str = "aiayn-prefetch") -> None:
        if depth < 1:
            raise ValueError(f"a prefetcher needs a depth of at least 1, got {depth}")
        self._source = source
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False  # the end or an error was handed out
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        _open.add(self)
        self._thread.start()

    def _work(self) -> None:
        iterator = iter(self._source)
        try:
            while not self._stop.is_set():  # checked before each item: none is made after close()
                try:
                    item = next(iterator)
                except StopIteration:
                    self._put(_END, None)
                    return
                self._put(_ITEM, item)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who raises it
            self._put(_ERROR, exc)
        finally:
            close = getattr(iterator, "close", None)  # a generator's finally blocks run here
            if close is not None:
                close()

    def _put(self, kind: int, value: Any) -> bool:
        """Queue an entry unless closed. After close() has emptied the queue, the one entry
        that may still come finds room, so this never blocks once closed."""
        if self._stop.is_set():
            return False
        self._queue.put((kind, value))
        return True

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._stop.is_set():
            raise RuntimeError("the prefetching iterator was closed; start a new pass")
        if self._finished:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value
        self._finished = True
        self._thread.join()
        if kind == _ERROR:
            raise value
        raise StopIteration

    @property
    def alive(self) -> bool:
        """Whether the thread is still running."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread and drop what it prepared; waits up to ``CLOSE_TIMEOUT`` for the
        item in progress. Idempotent."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_TIMEOUT)
        _open.discard(self)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
