"""The connection guard of `aiayn serve` (aiayn.serving.connections) driven in-process.

Each connection is a :class:`GuardedH11Protocol` on a fake transport that records what the
server writes and whether it closed; an event loop whose clock moves only when a test
advances it fires the header, body and keep-alive deadlines (and the registry's waiting
times read the same clock), so every deadline is checked to the exact second and no test
sleeps. A small ASGI app stands in for the API: it answers ``200`` with ``METHOD PATH``,
or holds its answer until the test opens its gate; it answers ``/early`` before reading
the request's body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import h11
import pytest

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client", reason="the 'serve' extra is not installed")

from uvicorn.server import ServerState  # noqa: E402

from aiayn.serving import connections  # noqa: E402
from aiayn.serving.connections import (  # noqa: E402
    ConnectionLimits,
    GuardedH11Protocol,
    _Registry,
    guarded_protocol,
    raw_error,
)
from aiayn.serving.metrics import ServerMetrics  # noqa: E402

LIMITS = ConnectionLimits(header_timeout_s=8.0, body_timeout_s=20.0, max_connections=3, keep_alive_s=45.0)
RETRY_AFTER_S = 7
T0 = 1000.0  # the loop's clock when a test starts

HEADER_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: 88\r\n"
              b"connection: close\r\n\r\n"
              b'{"error": "request_timeout", "message": "the request headers did not arrive within 8 s"}')
BODY_408 = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\ncontent-length: 86\r\n"
            b"connection: close\r\n\r\n"
            b'{"error": "request_timeout", "message": "the request body did not arrive within 20 s"}')
REFUSED_503 = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 134\r\n"
               b"connection: close\r\nretry-after: 7\r\n\r\n"
               b'{"error": "too_many_connections", "message": "the server holds 3 connections '
               b'(--max-connections) and none can make room; retry later"}')

GET_A = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
GET_C = b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n"
POST_HEAD = b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"  # its 5-byte body follows
CHUNKED_AB = b"2\r\nab\r\n0\r\n\r\n"
BOTH_LENGTHS = (b"POST /t HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n"
                % len(CHUNKED_AB)) + CHUNKED_AB


def ok(method: str, path: str) -> bytes:
    """The stand-in app's answer to ``method path``."""
    answer = f"{method} {path}".encode()
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)


class ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock stands still until :meth:`advance_to` moves it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0

    def time(self) -> float:
        return self.now

    def run_ready(self) -> None:
        """Run every callback that is due, and what those schedule in turn."""
        for _ in range(10):
            self.run_until_complete(asyncio.sleep(0))

    def advance_to(self, seconds_after_t0: float) -> None:
        assert T0 + seconds_after_t0 >= self.now
        self.now = T0 + seconds_after_t0
        self.run_ready()


class FakeTransport:
    """What the server did to one connection: bytes written, closes, EOFs, reading paused."""

    def __init__(self, can_write_eof: bool = True) -> None:
        self.chunks: list[bytes] = []
        self.closes = 0
        self.eofs = 0
        self.reading = True
        self._can_write_eof = can_write_eof

    @property
    def sent(self) -> bytes:
        return b"".join(self.chunks)

    def write(self, data: bytes) -> None:
        self.chunks.append(data)

    def close(self) -> None:
        self.closes += 1

    def is_closing(self) -> bool:
        return self.closes > 0

    def can_write_eof(self) -> bool:
        return self._can_write_eof

    def write_eof(self) -> None:
        self.eofs += 1

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("203.0.113.7", 50123), "sockname": ("127.0.0.1", 8000)}.get(name, default)


class Server:
    """One server's protocol class, uvicorn config and state, and the stand-in app."""

    def __init__(self, loop: ClockLoop, metrics: ServerMetrics | None) -> None:
        self.loop, self.metrics = loop, metrics
        self.protocol = guarded_protocol(LIMITS, metrics, retry_after_s=RETRY_AFTER_S)
        self.config = uvicorn.Config(self.app, http=self.protocol, interface="asgi3", lifespan="off", ws="none",
                                     log_config=None, proxy_headers=False, access_log=False,
                                     timeout_keep_alive=10_000)
        self.state = ServerState()
        self.requests: list[tuple[str, str, bytes]] = []  # as the app received them
        self.disconnects = 0  # requests whose client left before the app had their body
        self.gate: asyncio.Event | None = None  # when set: the app holds its answers until the gate opens

    async def app(self, scope: dict, receive: Any, send: Any) -> None:
        body = b""
        while scope["path"] != "/early":  # /early is answered before its body is read
            message = await receive()
            if message["type"] == "http.disconnect":
                self.disconnects += 1
                return
            body += message["body"]
            if not message["more_body"]:
                break
        self.requests.append((scope["method"], scope["path"], body))
        if self.gate is not None:
            await self.gate.wait()
        answer = f"{scope['method']} {scope['path']}".encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    @property
    def waiting(self) -> dict:
        return self.protocol.registry.waiting

    @property
    def open(self) -> int:
        return self.protocol.registry.open

    def connect(self, can_write_eof: bool = True) -> tuple[GuardedH11Protocol, FakeTransport]:
        transport = FakeTransport(can_write_eof)
        proto = self.protocol(self.config, self.state, {}, _loop=self.loop)
        proto.connection_made(transport)  # type: ignore[arg-type]
        self.loop.run_ready()
        return proto, transport

    def receive(self, proto: GuardedH11Protocol, data: bytes) -> None:
        proto.data_received(data)
        self.loop.run_ready()

    def lose(self, proto: GuardedH11Protocol, exc: Exception | None = None) -> None:
        """The transport reports the connection gone (after a close, or the client left)."""
        proto.connection_lost(exc)
        self.loop.run_ready()

    def gauge(self) -> float:
        assert self.metrics is not None
        return self.metrics.value("aiayn_http_connections_open")

    def counts(self) -> dict[str, float]:
        """Every connection counter sample written so far, by name and labels."""
        assert self.metrics is not None
        found = {}
        for counter in (self.metrics.connections_timeouts, self.metrics.connections_evicted,
                        self.metrics.connections_rejected):
            for family in counter.collect():
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                        found[f"{sample.name}{{{labels}}}"] = sample.value
        return found


TIMEOUTS = "aiayn_http_connection_timeouts_total"
EVICTED = "aiayn_http_connections_evicted_total{reason=max_connections}"
REJECTED = "aiayn_http_connections_rejected_total{reason=max_connections}"


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[ClockLoop]:
    event_loop = ClockLoop()
    # The registry's waiting times read the same clock as the loop's deadlines.
    monkeypatch.setattr(connections, "time", SimpleNamespace(monotonic=event_loop.time))
    yield event_loop

    async def cancel_pending() -> None:  # apps still waiting for a body or their gate
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    event_loop.run_until_complete(cancel_pending())
    event_loop.close()


@pytest.fixture
def server(loop: ClockLoop) -> Server:
    return Server(loop, ServerMetrics())


# ------------------------------------------------------------------------ building blocks



def _open_until(server: Server, transport: FakeTransport, deadline: float) -> None:
    """The connection is still open a millisecond before ``deadline``; the loop then reaches it."""
    server.loop.advance_to(deadline - 0.001)
    assert transport.closes == 0
    server.loop.advance_to(deadline)

def test_raw_error_is_a_complete_json_response_that_closes() -> None:
    assert raw_error(408, "Request Timeout", "request_timeout", "the request headers did not arrive within 8 s") \
        == HEADER_408
    assert raw_error(429, "Too Many Requests", "teapot", "short and stout") == (
        b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: 49\r\n"
        b'connection: close\r\n\r\n{"error": "teapot", "message": "short and stout"}')


def test_raw_error_says_when_to_retry() -> None:
    assert raw_error(503, "Service Unavailable", "busy", "later", 0) == (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 37\r\n"
        b'connection: close\r\nretry-after: 0\r\n\r\n{"error": "busy", "message": "later"}')
    assert raw_error(503, "Service Unavailable", "busy", "later", retry_after=12).endswith(
        b'connection: close\r\nretry-after: 12\r\n\r\n{"error": "busy", "message": "later"}')


def test_default_limits() -> None:
    assert ConnectionLimits() == ConnectionLimits(header_timeout_s=10.0, body_timeout_s=30.0, max_connections=4096,
                                                  keep_alive_s=30.0)


def test_each_server_gets_its_own_protocol_class_and_registry() -> None:
    metrics = ServerMetrics()
    cls = guarded_protocol(LIMITS, metrics, retry_after_s=RETRY_AFTER_S)
    assert cls.__name__ == "AiaynH11Protocol" and cls.__bases__ == (GuardedH11Protocol,)
    assert cls.limits is LIMITS and cls.metrics is metrics and cls.retry_after_s == RETRY_AFTER_S
    assert type(cls.registry) is _Registry and cls.registry is not GuardedH11Protocol.registry
    assert (cls.registry.open, cls.registry.waiting) == (0, {})
    other = guarded_protocol(ConnectionLimits())
    assert other.registry is not cls.registry and other.limits == ConnectionLimits()
    assert other.metrics is None and other.retry_after_s == 1


def test_the_evictable_connection_is_the_longest_waiting_once_it_has_waited_enough(loop: ClockLoop) -> None:
    registry = _Registry()
    assert (registry.open, registry.waiting) == (0, {})
    assert registry.evictable(0.0) is None  # nobody waiting
    registry.waiting.update({"first": T0, "second": T0 + 1.0})  # type: ignore[dict-item]
    loop.now = T0 + 1.5
    assert registry.evictable(2.0) is None
    assert registry.evictable(1.5) == "first"  # waited exactly the minimum
    assert registry.evictable(0.5) == "first"  # the oldest, though "second" has waited enough too
    loop.now = T0 + 2.0
    assert registry.evictable(2.0) == "first"
    assert registry.evictable(2.001) is None
    del registry.waiting["first"]
    assert registry.evictable(1.0) == "second" and registry.evictable(1.001) is None


def test_a_new_protocol_has_no_deadline_and_nothing_received(server: Server) -> None:
    proto = server.protocol(server.config, server.state, {}, _loop=server.loop)
    assert proto.loop is server.loop and proto._timer is None and proto._phase is h11.IDLE
    assert (proto._got_bytes, proto._served, proto._refused, proto._idle) == (False,) * 4
    assert proto._framing_checked is None
    assert type(proto._got_bytes) is type(proto._served) is type(proto._refused) is type(proto._idle) is bool


# ------------------------------------------------------------------------ counting


def test_open_connections_are_counted_up_and_down(server: Server) -> None:
    first, first_transport = server.connect()
    assert (server.open, server.gauge()) == (1, 1.0)
    second, second_transport = server.connect()
    assert (server.open, server.gauge()) == (2, 2.0) and server.state.connections == {first, second}
    assert list(server.waiting) == [first, second]
    server.lose(first)  # closed cleanly: uvicorn closes its side
    assert (server.open, server.gauge()) == (1, 1.0) and list(server.waiting) == [second]
    assert first_transport.closes == 1
    server.lose(second, ConnectionResetError())  # reset by the client: nothing left to close
    assert (server.open, server.gauge()) == (0, 0.0) and server.waiting == {}
    assert second_transport.closes == 0 and server.state.connections == set()
    server.loop.advance_to(1000)  # their deadlines went with them
    assert first_transport.sent == second_transport.sent == b"" and server.counts() == {}


# ------------------------------------------------------------------------ header deadline


def test_a_silent_connection_is_closed_at_the_header_deadline_without_an_answer(server: Server) -> None:
    proto, transport = server.connect()
    assert server.waiting == {proto: T0}
    _open_until(server, transport, 8.0)
    assert (transport.sent, transport.closes) == (b"", 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=headers}}": 1.0}
    assert server.waiting == {} and proto._timer is None  # not evictable while it closes
    server.lose(proto)
    assert (server.open, server.gauge()) == (0, 0.0)


def test_headers_are_due_from_the_connect_not_from_the_first_byte(server: Server) -> None:
    proto, transport = server.connect()
    server.loop.advance_to(5.0)
    server.receive(proto, b"GET /a HTTP/1.1\r\n")
    server.loop.advance_to(6.0)
    server.receive(proto, b"Host: x\r\n")  # each byte does not extend the deadline either
    assert server.waiting == {proto: T0}
    server.loop.advance_to(7.999)
    assert (transport.sent, transport.closes) == (b"", 0)
    server.loop.advance_to(8.0)
    assert (transport.sent, transport.closes) == (HEADER_408, 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=headers}}": 1.0} and server.requests == []
    server.lose(proto)
    assert server.open == 0


def test_a_deadline_that_meets_a_closing_connection_does_nothing(server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, b"GET /a HTTP/1.1\r\n")
    transport.close()  # closed by the server for another reason; its loss not yet reported
    server.loop.advance_to(8.0)
    assert (transport.sent, transport.closes) == (b"", 1)
    assert server.counts() == {} and server.waiting == {}


def test_a_lost_connection_has_no_deadline(server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, b"GET /a HTTP/1.1\r\n")
    server.lose(proto, ConnectionResetError())
    assert server.waiting == {} and proto._timer is None
    server.loop.advance_to(100.0)
    assert (transport.sent, transport.closes) == (b"", 0) and server.counts() == {}


# ------------------------------------------------------------------------ body deadline


def test_a_stalled_body_gets_408_at_the_body_deadline(server: Server) -> None:
    proto, transport = server.connect()
    server.loop.advance_to(1.0)
    server.receive(proto, POST_HEAD + b"ab")  # the body is due within 20 s of its headers
    assert server.waiting == {}  # a request in progress is never evicted
    server.loop.advance_to(15.0)
    server.receive(proto, b"c")  # more of the body does not extend the deadline
    server.loop.advance_to(20.999)
    assert (transport.sent, transport.closes) == (b"", 0)
    server.loop.advance_to(21.0)
    assert (transport.sent, transport.closes) == (BODY_408, 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=body}}": 1.0}
    server.lose(proto)
    assert server.disconnects == 1 and server.requests == []  # the app saw the client leave
    assert server.open == 0


def test_a_client_leaving_mid_body_reaches_the_app_and_stops_the_deadline(server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, POST_HEAD + b"ab")
    server.lose(proto, ConnectionResetError())
    assert server.disconnects == 1 and proto._timer is None
    server.loop.advance_to(100.0)
    assert (transport.sent, transport.closes) == (b"", 0) and server.counts() == {}


# ------------------------------------------------------------------------ served and kept alive


def test_a_request_in_the_app_has_no_deadline_then_an_idle_one_has_keep_alive(server: Server) -> None:
    server.gate = asyncio.Event()
    proto, transport = server.connect()
    server.loop.advance_to(1.0)
    server.receive(proto, GET_A)
    assert server.requests == [("GET", "/a", b"")]
    assert server.waiting == {} and proto._timer is None and proto._idle is False
    server.loop.advance_to(500.0)  # the app takes its time: neither deadline applies
    assert (transport.sent, transport.closes) == (b"", 0)
    server.gate.set()
    server.loop.run_ready()
    assert (transport.sent, transport.closes) == (ok("GET", "/a"), 0)
    assert server.waiting == {}  # a connection that has had an answer is never evicted
    assert proto._got_bytes is False
    server.loop.advance_to(544.999)
    assert transport.closes == 0
    server.loop.advance_to(545.0)  # idle for keep_alive_s: closed without a word
    assert (transport.sent, transport.closes) == (ok("GET", "/a"), 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=idle}}": 1.0}


def test_the_next_request_on_a_kept_alive_connection_has_its_headers_due_from_its_first_byte(
        server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, GET_A)
    assert transport.sent == ok("GET", "/a")
    server.loop.advance_to(30.0)  # idle past the header timeout, within keep-alive
    server.receive(proto, b"GET /b HTTP/1.1\r\n")
    assert server.waiting == {}
    _open_until(server, transport, 38.0)
    assert (transport.sent, transport.closes) == (ok("GET", "/a") + HEADER_408, 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=headers}}": 1.0}


def test_the_next_request_on_a_kept_alive_connection_has_the_body_deadline(server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, GET_A)
    server.loop.advance_to(30.0)
    server.receive(proto, POST_HEAD)
    _open_until(server, transport, 50.0)
    assert (transport.sent, transport.closes) == (ok("GET", "/a") + BODY_408, 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=body}}": 1.0}


def test_a_request_answered_on_a_kept_alive_connection_keeps_it_alive_again(server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, GET_A)
    server.loop.advance_to(40.0)
    server.receive(proto, GET_C)
    assert transport.sent == ok("GET", "/a") + ok("GET", "/c")
    _open_until(server, transport, 85.0)  # keep-alive counts from the second answer
    assert transport.closes == 1 and server.counts() == {f"{TIMEOUTS}{{phase=idle}}": 1.0}


def test_a_request_pipelined_behind_an_answer_has_its_headers_due_from_the_answer(server: Server) -> None:
    server.gate = asyncio.Event()
    proto, transport = server.connect()
    server.receive(proto, GET_A + b"GET /b HTTP/1.1\r\n")  # the second request's start came with the first
    server.loop.advance_to(3.0)
    server.gate.set()
    server.loop.run_ready()
    assert transport.sent == ok("GET", "/a") and server.waiting == {}
    _open_until(server, transport, 11.0)
    assert (transport.sent, transport.closes) == (ok("GET", "/a") + HEADER_408, 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=headers}}": 1.0}


def test_a_body_pipelined_behind_an_answer_gets_408_at_the_body_deadline(server: Server) -> None:
    proto, transport = server.connect()
    server.loop.advance_to(1.0)
    server.receive(proto, GET_A + POST_HEAD + b"ab")
    server.loop.advance_to(20.999)
    assert (transport.sent, transport.closes) == (ok("GET", "/a"), 0)
    server.loop.advance_to(21.0)
    assert (transport.sent, transport.closes) == (ok("GET", "/a") + BODY_408, 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=body}}": 1.0}


def test_a_request_answered_before_its_body_gets_no_second_answer(server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, POST_HEAD.replace(b"/t", b"/early") + b"a")
    assert transport.sent == ok("POST", "/early")
    server.loop.advance_to(5.0)
    server.receive(proto, b"b")  # the client goes on sending the body, then stalls
    server.loop.advance_to(19.999)
    assert transport.closes == 0
    server.loop.advance_to(20.0)  # closed at the body deadline, its one answer given
    assert (transport.sent, transport.closes) == (ok("POST", "/early"), 1)
    assert server.counts() == {f"{TIMEOUTS}{{phase=body}}": 1.0}


# ------------------------------------------------------------------------ framing


def test_two_body_lengths_close_the_connection_after_the_answer(server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, BOTH_LENGTHS + GET_C)  # the GET behind it must never be read
    assert server.requests == [("POST", "/t", b"ab")]
    assert (transport.sent, transport.closes) == (ok("POST", "/t"), 1)
    assert proto.cycle.keep_alive is False and proto._framing_checked is proto.cycle
    assert proto._timer is None and server.waiting == {}
    server.loop.advance_to(1000.0)
    assert transport.sent == ok("POST", "/t") and server.counts() == {}


CHUNKED_POST = b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + CHUNKED_AB


@pytest.mark.parametrize("request_", [POST_HEAD + b"abcde", CHUNKED_POST], ids=["content-length", "transfer-encoding"])
def test_one_body_length_keeps_the_connection(server: Server, request_: bytes) -> None:
    proto, transport = server.connect()
    server.receive(proto, request_ + GET_C)
    assert [r[:2] for r in server.requests] == [("POST", "/t"), ("GET", "/c")]
    assert (transport.sent, transport.closes) == (ok("POST", "/t") + ok("GET", "/c"), 0)
    assert proto.cycle.keep_alive is True


def test_two_body_lengths_in_a_pipelined_request_close_after_its_answer(server: Server) -> None:
    proto, transport = server.connect()
    server.receive(proto, GET_A + BOTH_LENGTHS + GET_C)
    assert server.requests == [("GET", "/a", b""), ("POST", "/t", b"ab")]
    assert (transport.sent, transport.closes) == (ok("GET", "/a") + ok("POST", "/t"), 1)
    assert proto._timer is None


# ------------------------------------------------------------------------ the cap


@pytest.mark.parametrize("can_write_eof", [True, False])
def test_at_the_cap_a_new_connection_gets_503_and_a_lingering_close(server: Server, can_write_eof: bool) -> None:
    held = [server.connect() for _ in range(LIMITS.max_connections)]  # at the cap, not over it
    server.loop.advance_to(0.5)  # none has waited long enough to be evicted
    refused, transport = server.connect(can_write_eof)
    assert transport.sent == REFUSED_503 and transport.eofs == int(can_write_eof)
    assert server.counts() == {REJECTED: 1.0}
    assert (server.open, server.gauge()) == (4, 4.0)
    assert list(server.waiting) == [proto for proto, _ in held] and refused._timer is None
    server.receive(refused, GET_A)  # read and dropped
    assert transport.sent == REFUSED_503 and server.requests == []
    server.loop.advance_to(1.499)
    assert transport.closes == 0  # the client can still read the answer
    server.loop.advance_to(1.5)
    assert transport.closes == 1
    server.lose(refused)
    assert (server.open, server.gauge()) == (3, 3.0)
    assert all((t.sent, t.closes) == (b"", 0) for _, t in held)
    server.loop.advance_to(100.0)  # the refused one has no deadline of its own
    assert transport.sent == REFUSED_503 and server.counts() == {REJECTED: 1.0, f"{TIMEOUTS}{{phase=headers}}": 3.0}


def test_at_the_cap_the_longest_waiting_connection_is_evicted_once_it_has_waited_enough(server: Server) -> None:
    oldest, oldest_transport = server.connect()
    server.loop.advance_to(0.5)
    middle, middle_transport = server.connect()
    server.loop.advance_to(1.0)
    newest, newest_transport = server.connect()
    server.loop.advance_to(1.999)  # the oldest has waited just under a quarter of the header timeout
    early, early_transport = server.connect()
    assert early_transport.sent == REFUSED_503 and oldest_transport.closes == 0
    server.loop.advance_to(2.0)
    comer, comer_transport = server.connect()
    assert (comer_transport.sent, comer_transport.closes) == (b"", 0)
    assert (oldest_transport.sent, oldest_transport.closes) == (b"", 1)
    assert list(server.waiting) == [middle, newest, comer] and oldest._timer is None
    assert server.counts() == {EVICTED: 1.0, REJECTED: 1.0}
    server.lose(oldest)
    server.lose(early)
    assert (server.open, server.gauge()) == (3, 3.0)
    server.loop.advance_to(8.499)  # the evicted one's deadline passed without a timeout
    assert server.counts() == {EVICTED: 1.0, REJECTED: 1.0}
    assert middle_transport.closes == newest_transport.closes == 0


def test_busy_and_answered_connections_are_never_evicted(server: Server) -> None:
    busy, busy_transport = server.connect()
    server.receive(busy, POST_HEAD + b"ab")  # in its body
    answered, answered_transport = server.connect()
    server.receive(answered, GET_A)  # kept alive after its answer
    server.loop.advance_to(1.0)
    young, young_transport = server.connect()
    server.loop.advance_to(2.5)  # the first two are past the evictable age, the third is not
    newcomer, newcomer_transport = server.connect()
    assert newcomer_transport.sent == REFUSED_503
    assert busy_transport.closes == answered_transport.closes == young_transport.closes == 0
    assert server.counts() == {REJECTED: 1.0} and list(server.waiting) == [young]


# ------------------------------------------------------------------------ shutdown


def test_shutdown_closes_idle_and_mid_body_connections_at_once(server: Server) -> None:
    fresh, fresh_transport = server.connect()
    answered, answered_transport = server.connect()
    server.receive(answered, GET_A)
    in_body, in_body_transport = server.connect()
    server.receive(in_body, POST_HEAD + b"ab")
    for proto in (fresh, answered, in_body):
        proto.shutdown()
    assert [t.closes for t in (fresh_transport, answered_transport, in_body_transport)] == [1, 1, 1]
    assert (fresh_transport.sent, answered_transport.sent, in_body_transport.sent) == (b"", ok("GET", "/a"), b"")
    assert in_body._timer is None and in_body.cycle.keep_alive is True  # closed, not left to finish
    server.loop.advance_to(100.0)
    assert server.counts() == {} and server.requests == [("GET", "/a", b"")]


def test_shutdown_lets_a_request_in_the_app_finish_then_closes(server: Server) -> None:
    server.gate = asyncio.Event()
    proto, transport = server.connect()
    server.receive(proto, GET_A)
    proto.shutdown()
    assert transport.closes == 0 and proto.cycle.keep_alive is False
    server.gate.set()
    server.loop.run_ready()
    assert (transport.sent, transport.closes) == (ok("GET", "/a"), 1)
    assert proto._timer is None and server.counts() == {}


# ------------------------------------------------------------------------ without metrics


def test_without_metrics_the_limits_still_apply(loop: ClockLoop) -> None:
    server = Server(loop, None)
    first, first_transport = server.connect()
    server.receive(first, b"GET /a HTTP/1.1\r\n")
    loop.advance_to(2.0)
    _, second_transport = server.connect()
    _, third_transport = server.connect()
    _, refused_transport = server.connect()  # the first is evictable: it is
    assert (first_transport.sent, first_transport.closes) == (b"", 1)
    assert refused_transport.sent == b""
    server.lose(first)
    _, over_transport = server.connect()  # nobody has waited long enough now
    assert over_transport.sent == REFUSED_503
    loop.advance_to(10.0)
    assert second_transport.sent == third_transport.sent == b"" and second_transport.closes == 1
