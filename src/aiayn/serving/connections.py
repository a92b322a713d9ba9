"""Connection-level limits for ``aiayn serve``: header and body timeouts and a cap on
open connections, which uvicorn does not have (its keep-alive timer is reset by every
byte, so a client that sends one header byte every few seconds is kept forever).

:func:`guarded_protocol` returns a subclass of uvicorn's h11 protocol, passed to
``uvicorn.Config(http=...)``. It watches h11's view of the client's state after every
chunk received:

- ``IDLE`` (waiting for a request line and headers): the connection must complete its
  headers within ``header_timeout_s`` of connecting or of its previous response;
- ``SEND_BODY``: the whole body must arrive within ``body_timeout_s`` of the headers;
- a client that misses either gets ``408 request_timeout`` (if it sent anything and its
  request has no answer yet: an app may answer before it has read the body) and is closed.

A connection that has had an answer may stay idle for ``keep_alive_s`` before its next
request's first byte (then the header deadline applies from that byte): far longer than
the 5 s after which httpx and most client pools drop an idle connection, so a client,
even a slow, overloaded one, does not send on a connection the server is closing.
uvicorn's own keep-alive timer is set to fire after these.

At ``max_connections`` open connections, a new one evicts the connection that has waited
longest for its first request's headers, if that one has waited at least
:data:`MIN_EVICTABLE_WAIT` of the header timeout (slow clients cannot lock out others, a
storm of reconnecting slow clients cannot evict a client that has just connected, and a
kept-alive connection that has had an answer is never evicted: a slow client never gets
one, and its idle time is bounded by the header timeout anyway); otherwise the
new one gets ``503 too_many_connections`` with ``Retry-After`` and is closed. On shutdown,
connections still sending a request body are closed at once instead of holding the
graceful shutdown open.

A request with both ``Content-Length`` and ``Transfer-Encoding`` (a sign of request
smuggling) is answered (the app's ``400 ambiguous_framing``, or whatever comes first, e.g.
a 401) and its connection is closed after that answer, as RFC 9112 section 6.3 requires:
nothing after it on the connection is read as a request.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from aiayn.serving.metrics import ServerMetrics


@dataclass(frozen=True)
class ConnectionLimits:
    """``aiayn serve --header-timeout/--body-timeout/--max-connections``."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096
    keep_alive_s: float = 30.0


LINGER_S = 1.0
"""How long a refused connection's unread input is still drained before it is closed."""

MIN_EVICTABLE_WAIT = 0.25
"""Share of the header timeout a connection must have waited before a new one may evict it."""


def raw_error(status: int, reason: str, code: str, message: str, retry_after: int | None = None) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 response with the API's JSON error body,
    for answers given below the ASGI app (no request object exists yet)."""
    body = json.dumps({"error": code, "message": message}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class _Registry:
    """Open connections of one server, oldest first, with those waiting for headers apart
    (dicts keep insertion order: the first key is the one waiting longest)."""

    def __init__(self) -> None:
        self.open = 0
        self.waiting: dict[GuardedH11Protocol, float] = {}  # -> when it started waiting

    def evictable(self, min_wait_s: float) -> GuardedH11Protocol | None:
        """The connection waiting longest for its headers, if it has waited ``min_wait_s``."""
        oldest = next(iter(self.waiting.items()), None)
        if oldest is None or time.monotonic() - oldest[1] < min_wait_s:
            return None
        return oldest[0]


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with :class:`ConnectionLimits` (set by :func:`guarded_protocol`)."""

    limits = ConnectionLimits()
    metrics: ServerMetrics | None = None
    registry: _Registry = _Registry()
    retry_after_s = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._phase: object = h11.IDLE  # h11's view of the client: IDLE, SEND_BODY, DONE, ...
        self._got_bytes = False
        self._served = False
        self._refused = False
        self._idle = False  # kept alive after an answer, nothing of the next request yet
        self._framing_checked: object = None  # the request cycle whose headers were checked

    # ---------------------------------------------------------------- events

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        reg = self.registry
        reg.open += 1
        if self.metrics is not None:
            self.metrics.connections_open.set(reg.open)
        if reg.open > self.limits.max_connections and not self._evict_one():
            self._refuse()
            return
        self._wait_for("headers")

    def _refuse(self) -> None:
        """Answer 503 and close gently: closing a socket with the client's request unread
        would reset the connection and could destroy the answer before the client reads it
        (a "lingering close", as web servers do)."""
        self._count("rejected", reason="max_connections")
        self._refused = True
        self.transport.write(raw_error(503, "Service Unavailable", "too_many_connections",
                                       f"the server holds {self.limits.max_connections} connections "
                                       "(--max-connections) and none can make room; retry later",
                                       self.retry_after_s))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.registry.open -= 1
        if self.metrics is not None:
            self.metrics.connections_open.set(self.registry.open)
        self._stop_waiting()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped until the lingering close
        self._got_bytes = True
        if self._idle:  # the next request's first byte: its headers are due from now
            self._wait_for("headers")
        super().data_received(data)
        self._check_framing()
        self._follow_client()

    def on_response_complete(self) -> None:
        answered = self.cycle
        super().on_response_complete()
        # Bytes of the next request may be here already (pipelined): a request parsed inside
        # super(), or the start of one that h11 holds.
        self._got_bytes = self.cycle is not answered or bool(self.conn.trailing_data[0])
        self._served = True
        # A pipelined next request may already be complete (handled inside super()).
        self._check_framing()
        self._follow_client()

    def _check_framing(self) -> None:
        """A new request with two body lengths: close the connection after its answer."""
        cycle = getattr(self, "cycle", None)
        if cycle is None or cycle is self._framing_checked:
            return
        self._framing_checked = cycle
        names = {name.lower() for name, _ in cycle.scope.get("headers") or []}
        if b"content-length" in names and b"transfer-encoding" in names:
            cycle.keep_alive = False

    def shutdown(self) -> None:
        if self._phase is h11.SEND_BODY:
            # Not yet a request the app can answer: holding shutdown for it helps nobody.
            self._stop_waiting()
            self.transport.close()
            return
        super().shutdown()

    # ---------------------------------------------------------------- timers

    def _follow_client(self) -> None:
        """Arm, move or stop the timer as h11 sees the client's side change."""
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is self._phase:
            return
        self._phase = state
        if state is h11.IDLE:
            self._wait_for("headers")
        elif state is h11.SEND_BODY:
            self._wait_for("body")
        else:
            self._stop_waiting()

    def _wait_for(self, phase: str) -> None:
        self._stop_waiting()
        self._idle = phase == "headers" and self._served and not self._got_bytes
        if phase == "headers":
            self._phase = h11.IDLE
            if not self._served:  # a connection that has had an answer is a real client's
                self.registry.waiting[self] = time.monotonic()
        if self._idle:
            seconds = self.limits.keep_alive_s
        else:
            seconds = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
        self._timer = self.loop.call_later(seconds, self._timed_out, "idle" if self._idle else phase, seconds)

    def _stop_waiting(self) -> None:
        self._idle = False
        self.registry.waiting.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self, phase: str, seconds: float) -> None:
        self._timer = None
        self.registry.waiting.pop(self, None)
        if self.transport.is_closing():
            return
        self._count("timeouts", phase=phase)
        if self._got_bytes and self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # nothing answered yet
            self.transport.write(raw_error(408, "Request Timeout", "request_timeout",
                                           f"the request {phase} did not arrive within {seconds:g} s"))
        self.transport.close()

    def _evict_one(self) -> bool:
        victim = self.registry.evictable(MIN_EVICTABLE_WAIT * self.limits.header_timeout_s)
        if victim is None or victim is self:
            return False
        self._count("evicted", reason="max_connections")
        victim._stop_waiting()
        victim.transport.close()
        return True

    def _count(self, what: str, **labels: str) -> None:
        if self.metrics is not None:
            getattr(self.metrics, f"connections_{what}").labels(**labels).inc()


def guarded_protocol(limits: ConnectionLimits, metrics: ServerMetrics | None = None,
                     retry_after_s: int = 1) -> type[GuardedH11Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing ``limits`` for one server."""
    return type("AiaynH11Protocol", (GuardedH11Protocol,),
                {"limits": limits, "metrics": metrics, "registry": _Registry(), "retry_after_s": retry_after_s})
