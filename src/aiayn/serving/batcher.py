"""Dynamic batching: gather concurrent requests into token-budget batches for one model.

One model, one worker thread. Requests wait in a bounded FIFO queue; the worker takes
the oldest request, waits up to ``window_ms`` after its arrival for others with the same
decoding options to join (or until the token budget is full), and translates them
together in one ``translate_fn`` call. While the worker is busy, requests pile up, so
under load batches fill up by themselves and the window is no extra delay: the batch
size adapts to the arrival rate (the same idea as Triton's and TGI's dynamic batchers).

Failure isolation: if a batch of several requests raises, each request is retried on its
own, so one bad request fails alone and never takes its neighbours down with it.

Abandoned requests: :meth:`DynamicBatcher.withdraw` takes a request whose client has gone
out of the queue (its future cancelled), so no model time is spent on an answer nobody
reads; a request already being translated finishes, and its result is dropped.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiayn.serving.metrics import ServerMetrics

log = logging.getLogger(__name__)

# translate_fn(items, nbest, attention, decode_overrides) -> one result per item (a text, or
# whatever the caller queues for one).
TranslateFn = Callable[[list[Any], int, bool, dict[str, Any]], Sequence[Any]]


class QueueFullError(RuntimeError):
    """The queue holds ``queue_size`` requests already: the caller should answer 503."""


class ShuttingDownError(RuntimeError):
    """The server is stopping and takes no new work."""


@dataclass(frozen=True)
class DecodeOptions:
    """What must be equal for two requests to share one model call."""

    nbest: int = 1
    attention: bool = False
    overrides: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def make(cls, nbest: int = 1, attention: bool = False, overrides: dict[str, Any] | None = None) -> DecodeOptions:
        return cls(nbest, attention, tuple(sorted((overrides or {}).items())))


@dataclass
class _Pending:
    texts: list[Any]  # one item per text
    src_lens: list[int]  # source tokens per text, for the token budget
    options: DecodeOptions
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    arrived: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class BatchLimits:
    """How large a batch may grow and how long it waits: ``max_batch_tokens`` bounds its padded
    source size (sentences x longest source), the usual token budget; ``max_batch_sentences``
    its rows; ``window_ms`` how long the first request waits for others; ``queue_size`` the
    requests waiting before a new one is refused."""

    max_batch_tokens: int = 4096
    max_batch_sentences: int = 64
    window_ms: float = 5.0
    queue_size: int = 256

    def __post_init__(self) -> None:
        if self.queue_size < 1 or self.max_batch_tokens < 1 or self.max_batch_sentences < 1 or self.window_ms < 0:
            raise ValueError("queue_size, max_batch_tokens, max_batch_sentences must be positive, window_ms >= 0")


class DynamicBatcher:
    """Queue + worker thread. :meth:`submit` returns a future of one result per text.

    Batches grow within ``limits`` (:class:`BatchLimits`). With ``enabled=False`` every request
    is translated on its own, one after the other (the baseline the benchmark compares against).
    """

    def __init__(self, translate_fn: TranslateFn, *, metrics: ServerMetrics | None = None,
                 limits: BatchLimits = BatchLimits(), enabled: bool = True,
                 target_tokens: Callable[[Any], int] | None = None) -> None:
        self.translate_fn = translate_fn
        self.metrics = metrics or ServerMetrics()
        self.max_batch_tokens = limits.max_batch_tokens
        self.max_batch_sentences = limits.max_batch_sentences
        self.window_s = limits.window_ms / 1000.0
        self.queue_size = limits.queue_size
        self.enabled = enabled
        self.target_tokens = target_tokens or (lambda result: 0)
        self._queue: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._busy = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aiayn-batcher", daemon=True)
            self._thread.start()

    def submit(self, texts: Sequence[Any], src_lens: list[int], options: DecodeOptions) -> concurrent.futures.Future:
        """Queue one request; raises :class:`QueueFullError` or :class:`ShuttingDownError`."""
        pending = _Pending(list(texts), list(src_lens), options)
        with self._cond:
            if self._closing:
                raise ShuttingDownError("the server is shutting down")
            if len(self._queue) >= self.queue_size:
                self.metrics.rejected.inc()
                raise QueueFullError(f"{len(self._queue)} requests are waiting (queue size {self.queue_size})")
            self._queue.append(pending)
            self.metrics.queue_depth.set(len(self._queue))
            self._cond.notify_all()
        return pending.future

    def withdraw(self, future: concurrent.futures.Future) -> bool:
        """Drop the queued request of ``future`` (its client disconnected) and cancel it;
        False when it is no longer queued (being translated, or done)."""
        with self._cond:
            for p in self._queue:
                if p.future is future:
                    self._queue.remove(p)
                    self.metrics.queue_depth.set(len(self._queue))
                    self.metrics.abandoned.inc()
                    future.cancel()
                    self._cond.notify_all()
                    return True
        return False

    @property
    def depth(self) -> int:
        return len(self._queue)

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop taking requests, finish the queued ones, stop the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("batcher: worker still busy after %.0f s at shutdown", timeout or 0)
        # Anything left (only if the worker never started or timed out) fails cleanly.
        with self._cond:
            while self._queue:
                p = self._queue.popleft()
                if not p.future.done():
                    p.future.set_exception(ShuttingDownError("the server shut down before this request ran"))

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:  # closing and drained
                    return
                if self.enabled:
                    self._wait_for_batch()
                batch = self._take()
                self.metrics.queue_depth.set(len(self._queue))
            self._process(batch)

    def _wait_for_batch(self) -> None:
        """Hold the oldest request until its window ends or a full batch is waiting (lock held)."""
        deadline = self._queue[0].arrived + self.window_s
        while not self._closing:
            if self._select()[1]:
                return  # budget full: waiting longer cannot make the batch bigger
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(remaining)

    def _select(self) -> tuple[list[_Pending], bool]:
        """Queued requests that fit one batch with the oldest, and whether the budget is full.

        First come, first served among requests with the oldest request's options: the
        scan stops at the first one that does not fit, so a long request is never starved
        by a stream of short ones behind it.
        """
        first = self._queue[0]
        chosen = [first]
        if not self.enabled:
            return chosen, True
        rows = len(first.texts)
        longest = max(first.src_lens, default=1)
        for p in list(self._queue)[1:]:
            if p.options != first.options:
                continue
            new_rows = rows + len(p.texts)
            new_longest = max(longest, *p.src_lens) if p.src_lens else longest
            if new_rows > self.max_batch_sentences or new_rows * new_longest > self.max_batch_tokens:
                return chosen, True
            chosen.append(p)
            rows, longest = new_rows, new_longest
        full = rows >= self.max_batch_sentences or rows * longest >= self.max_batch_tokens
        return chosen, full

    def _take(self) -> list[_Pending]:
        chosen, _ = self._select()
        ids = {id(p) for p in chosen}
        self._queue = collections.deque(p for p in self._queue if id(p) not in ids)
        return chosen

    def _process(self, batch: list[_Pending]) -> None:
        live = [p for p in batch if p.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            self._translate(live)
        except Exception as exc:  # noqa: BLE001 - isolate failures per request
            if len(live) == 1:
                log.debug("request failed: %s", exc)
                live[0].future.set_exception(exc)
                return
            self.metrics.batch_failures.inc()
            log.warning("batch of %d requests failed (%s); retrying them one by one", len(live), exc)
            for p in live:
                try:
                    self._translate([p])
                except Exception as one_exc:  # noqa: BLE001
                    p.future.set_exception(one_exc)

    def _translate(self, batch: list[_Pending]) -> None:
        texts = [t for p in batch for t in p.texts]
        opts = batch[0].options
        start = time.perf_counter()
        results = list(self.translate_fn(texts, opts.nbest, opts.attention, dict(opts.overrides)))
        seconds = time.perf_counter() - start
        if len(results) != len(texts):
            raise RuntimeError(f"translator returned {len(results)} results for {len(texts)} texts")
        m = self.metrics
        m.batches.inc()
        m.batch_sentences.observe(len(texts))
        m.batch_requests.observe(len(batch))
        m.sentences.inc(len(texts))
        m.src_tokens.inc(sum(n for p in batch for n in p.src_lens))
        tgt = sum(self.target_tokens(r) for r in results)
        m.tgt_tokens.inc(tgt)
        m.model_seconds.inc(seconds)
        if seconds > 0:
            m.tokens_per_s.set(tgt / seconds)
        i = 0
        for p in batch:
            p.future.set_result(results[i:i + len(p.texts)])
            i += len(p.texts)
