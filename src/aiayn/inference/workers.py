"""Batches searched side by side by worker processes, each on its share of the CPU threads.

On a CPU a decoding step is a chain of modest matrix products and many small operations
driven from Python; splitting each product over two threads leaves both idle for part of
every step. :class:`SearchWorkers` forks processes that hold the engine as it is when they
start (weights shared with the parent, copy-on-write), each with ``threads`` torch threads,
and hands them whole batches: the batches of a request run side by side, their results come
back in order. The processes are started on first use and kept for later requests; each one
ends when the parent does, even one that exits without clean-up.

The searches run unchanged: a worker calls the engine's own ``search`` on the same batch
the parent would, so its hypotheses are the parent's (up to the floating-point sums of
another thread count, as with ``--threads``).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import queue
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from aiayn.inference.request import EncodedSentence, TranslationRequest

log = logging.getLogger(__name__)

PARENT_CHECK_S = 1.0  # how often an idle worker looks whether its parent is still there
STOP_S = 5.0  # how long closing waits for a worker to end before it kills the worker


def _portable_request(request: TranslationRequest) -> TranslationRequest:
    """What a search reads of ``request`` (its options): the texts, callables and progress stay
    with the parent."""
    return dataclasses.replace(request, texts=(), prefixes=None, constraints=None, progress=None, sources=None,
                               attention_summary=None)


Search = Callable[[list[EncodedSentence], TranslationRequest], list[Any]]


def _serve(search: Search, tasks: Any, results: Any, current: Any, threads: int, parent: int) -> None:
    """A worker's loop: (task id, batch, request) in, (task id, ok, hypotheses or
    exception) out, until told to stop or orphaned. A task of a map the parent left early
    (ids below ``current``) is skipped."""
    import torch

    torch.set_num_threads(threads)
    while os.getppid() == parent:  # an orphan stops: before its next batch, or within PARENT_CHECK_S idle
        try:
            task = tasks.get(timeout=PARENT_CHECK_S)
        except queue.Empty:
            continue
        if task is None:
            return
        task_id, batch, request = task
        if task_id < current.value:
            continue
        try:
            results.put((task_id, True, search(batch, request)))
        except Exception as exc:  # noqa: BLE001 - raised again in the parent, as in-process
            results.put((task_id, False, _portable(exc)))


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives the pickling the result queue applies to it (the processes
    exchange objects only through the queue; nothing is written), else a RuntimeError with
    its text: an exception the queue's feeder thread could not send would leave the parent
    waiting for its batch."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class SearchWorkers:
    """``workers`` forked processes of ``threads`` threads each that run ``search(batch,
    request)`` (the engine's, as it is when they start) on whole batches."""

    def __init__(self, search: Search, workers: int, threads: int = 1) -> None:
        if workers < 2:
            raise ValueError("SearchWorkers needs 2 or more workers")
        self.search, self.workers, self.threads = search, workers, threads
        self._processes: list[Any] = []
        self._next_id = 0

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        self._tasks, self._results = context.Queue(), context.Queue()
        self._current = context.Value("q", 0, lock=False)  # the first task id still wanted
        self._processes = [
            context.Process(target=_serve, daemon=True, name=f"aiayn-search-{k}",
                            args=(self.search, self._tasks, self._results, self._current, self.threads, os.getpid()))
            for k in range(self.workers)]
        for process in self._processes:
            process.start()
        log.info("decoding in %d worker processes of %d thread(s) each", self.workers, self.threads)

    def map(self, batches: Iterable[list[EncodedSentence]],
            request: TranslationRequest) -> Iterator[tuple[list[EncodedSentence], list[Any]]]:
        """Each batch with its hypotheses, in the order of ``batches``; a search's exception is
        raised here when its batch's turn comes, and the batches after it are dropped."""
        if not self._processes:
            self._start()
        portable = _portable_request(request)
        first = self._next_id
        sent: list[list[EncodedSentence]] = []
        for batch in batches:
            self._tasks.put((self._next_id, batch, portable))
            self._next_id += 1
            sent.append(batch)
        done: dict[int, tuple[bool, Any]] = {}
        try:
            for offset, batch in enumerate(sent):
                while first + offset not in done:
                    task_id, ok, value = self._result()
                    if task_id >= first:  # else a result of a map left early
                        done[task_id] = (ok, value)
                ok, value = done.pop(first + offset)
                if not ok:
                    raise value
                yield batch, value
        finally:
            self._current.value = self._next_id  # what is still queued of this map is skipped

    def _result(self) -> tuple[int, bool, Any]:
        while True:
            try:
                return self._results.get(timeout=PARENT_CHECK_S)
            except queue.Empty:
                dead = [p.name for p in self._processes if not p.is_alive()]
                if dead:
                    self.close()
                    raise RuntimeError(f"decoding worker {dead[0]} ended before its batch was done "
                                       "(out of memory?)") from None

    def close(self) -> None:
        """Stop the workers (they also stop on their own when this process ends)."""
        for process in self._processes:
            if process.is_alive():
                self._tasks.put(None)
        for process in self._processes:
            process.join(timeout=STOP_S)
            if process.is_alive():
                process.kill()
                process.join()  # reaped: no zombie left behind
        self._processes = []
