"""Connection limits of `aiayn serve` against raw sockets (aiayn.serving.connections):
half-sent headers and bodies time out with 408, slow clients cannot lock out others at
--max-connections, busy connections make a new one get 503 + Retry-After, and a client
stuck in its body does not hold the graceful shutdown open."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")

MAX_CONNECTIONS = 6
HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5
ROOMY_HEADER_TIMEOUT = 4.0


def _capped_server(serve_load: ModuleType, checkpoint: Path, header_timeout: float):
    return serve_load.start_server(checkpoint, "--threads", "1", "--header-timeout", str(header_timeout),
                                   "--body-timeout", str(BODY_TIMEOUT), "--max-connections", str(MAX_CONNECTIONS))


@pytest.fixture(scope="module")
def guarded(serve_load: ModuleType, tiny_checkpoint: Path) -> Iterator:
    with _capped_server(serve_load, tiny_checkpoint, HEADER_TIMEOUT) as srv:
        yield srv


@pytest.fixture(scope="module")
def roomy(serve_load: ModuleType, tiny_checkpoint: Path) -> Iterator:
    """``guarded`` with a header timeout long enough that an idle connection is still open
    when a test has waited past its evictable age, even on a starved CPU."""
    with _capped_server(serve_load, tiny_checkpoint, ROOMY_HEADER_TIMEOUT) as srv:
        yield srv


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _status_and_body(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _poll_until(condition: Callable[[], bool], deadline_s: float, what: str, pause_s: float = 0.05) -> None:
    """Check ``condition`` until it holds; fail naming ``what`` once ``deadline_s`` has passed."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {deadline_s:g} s: {what}"
        time.sleep(pause_s)


def _header_deadline_passed(url: str) -> None:
    """Return once a connection opened now has met its header deadline (its 408 arrived): the
    event that proves at least the header timeout has passed since the call."""
    with _connect(url) as probe:
        probe.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        status, _ = _status_and_body(_read_all(probe))
    assert status == 408


def test_half_sent_headers_get_408_and_are_closed(guarded) -> None:
    with _connect(guarded.url) as sock:
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: app")
        status, body = _status_and_body(_read_all(sock))
    assert status == 408
    assert body["error"] == "request_timeout"
    assert "headers" in body["message"] and f"{HEADER_TIMEOUT:g} s" in body["message"]


def test_a_byte_at_a_time_does_not_extend_the_header_timeout(guarded) -> None:
    # uvicorn's own keep-alive timer restarts on every byte; the header deadline does not.
    # A byte every 0.25 s for at most 4 header timeouts: the server must close the connection
    # before the bytes run out (a deadline reset by each byte would never close it).
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    budget = int(4 * HEADER_TIMEOUT / 0.25)
    with _connect(guarded.url) as sock:
        sock.settimeout(0.25)
        closed_after = None
        for i, byte in enumerate(request[:budget]):
            try:
                sock.sendall(bytes([byte]))
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                data = b""
            closed_after = i
            break
        assert closed_after is not None, f"the connection was still open after {budget} bytes, 0.25 s apart"
        if data:
            assert data.startswith(b"HTTP/1.1 408")


def test_a_stalled_body_gets_408(guarded) -> None:
    with _connect(guarded.url) as sock:
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"texts\": [")
        status, body = _status_and_body(_read_all(sock))
    assert status == 408
    assert "body" in body["message"]


def _read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_two_body_lengths_get_400_and_the_connection_is_closed(guarded) -> None:
    """Content-Length and Transfer-Encoding together (RFC 9112 section 6.3): one 400
    answer, then the connection closes; the request pipelined behind it is never read."""
    body = b'{"texts": ["s1 s2"]}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    request = (b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(chunked)) + chunked
    with _connect(guarded.url) as sock:
        sock.sendall(request + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = _read_all(sock)  # returns only once the server closes the connection
    assert raw.count(b"HTTP/1.1 ") == 1, raw
    status, answer = _status_and_body(raw)
    assert (status, answer["error"]) == (400, "ambiguous_framing")
    assert b"\r\nconnection: close\r\n" in raw.lower()


def test_a_served_connection_may_idle_longer_than_the_header_timeout(guarded) -> None:
    # Idle keep-alive is --keep-alive-timeout (30 s), not the header deadline: a client whose
    # pool keeps connections for 5 s must not meet a connection the server is closing.
    with _connect(guarded.url) as sock:
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.sendall(request)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        _header_deadline_passed(guarded.url)  # this connection has now idled past it
        sock.sendall(request)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        # ... but once the next request starts, its headers are due within the header timeout.
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        status, body = _status_and_body(_read_all(sock))
    assert status == 408 and "headers" in body["message"]


def test_keep_alive_between_requests_is_unaffected(guarded, sentences: list[str]) -> None:
    # Requests on one connection, each well within the timeouts: all answered on it.
    with httpx.Client(base_url=guarded.url, timeout=30) as client:
        for text in sentences[:3]:
            assert client.post("/v1/translate", json={"texts": [text]}).status_code == 200


def test_idle_clients_at_the_cap_make_room_for_a_real_one(roomy) -> None:
    evicted_before = _metric(roomy.url, "aiayn_http_connections_evicted_total")
    with ExitStack() as stack:
        idle = [stack.enter_context(_connect(roomy.url)) for _ in range(MAX_CONNECTIONS)]
        for sock in idle:
            sock.sendall(b"GET /hea")  # half a request line: waiting for headers
        # Just connected: not evictable yet (a storm of reconnects must not evict newcomers).
        with _connect(roomy.url) as early:
            status, body = _status_and_body(_read_all(early))
        assert (status, body["error"]) == (503, "too_many_connections")
        # Once they have waited MIN_EVICTABLE_WAIT (a quarter) of the header timeout, a newcomer
        # evicts one: tried until it is answered, before the idle ones would time out by
        # themselves (then nothing would need evicting).
        answers: list[int] = []

        def newcomer_answered() -> bool:
            with _connect(roomy.url) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answers.append(int(_read_all(sock).split()[1]))
            return answers[-1] == 200

        _poll_until(newcomer_answered, ROOMY_HEADER_TIMEOUT * 0.9, "a newcomer evicting an idle client")
    assert set(answers[:-1]) <= {503} and answers[-1] == 200
    assert _metric(roomy.url, "aiayn_http_connections_evicted_total") > evicted_before


def test_the_file_limit_is_raised_or_the_cap_lowered(monkeypatch, capsys) -> None:
    import resource

    from aiayn.cli.serve import fit_file_limit

    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 2000))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: calls.append(limits))
    assert fit_file_limit(1500) == 1500 and calls == [(1756, 2000)]
    assert fit_file_limit(4096) == 2000 - 256 and calls[-1] == (2000, 2000)
    assert "--max-connections 4096 needs 4352 open files and the limit is 2000" in capsys.readouterr().err


def test_busy_connections_at_the_cap_give_503_with_retry_after(guarded) -> None:
    with ExitStack() as stack:
        busy = [stack.enter_context(_connect(guarded.url)) for _ in range(MAX_CONNECTIONS)]
        for sock in busy:  # headers complete, body pending: a request in progress
            sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 50\r\n\r\n{")
        with _connect(guarded.url) as extra:
            raw = _read_all(extra)
        # Each of the six was busy (in its body, not idle): each ends with the body's 408.
        # Reading until the server closes them is the event the test waits for, not a sleep.
        ends = [_status_and_body(_read_all(sock)) for sock in busy]
    status, body = _status_and_body(raw)
    assert status == 503
    assert body["error"] == "too_many_connections"
    assert b"retry-after: 1" in raw.lower()
    assert [(code, "body" in b["message"]) for code, b in ends] == [(408, True)] * MAX_CONNECTIONS
    # With the stalled bodies closed, the server takes connections again.
    assert httpx.get(f"{guarded.url}/health", timeout=30).status_code == 200


def test_a_stalled_body_does_not_hold_shutdown_open(serve_load: ModuleType, tiny_checkpoint: Path) -> None:
    # Timeouts longer than the test: only the shutdown rule can close this client.
    srv = serve_load.launch_server(tiny_checkpoint, "--threads", "1", "--body-timeout", "600",
                                   "--graceful-timeout", "600")
    try:
        with _connect(srv.url) as sock:
            sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            # The server holds this connection (2 open: it and the metrics request) before
            # the signal.
            _poll_until(lambda: _metric(srv.url, "aiayn_http_connections_open") == 2, 30,
                        "the stalled connection open on the server")
            srv.proc.send_signal(signal.SIGTERM)
            srv.proc.wait(120)
            assert _read_all(sock) == b""  # closed without an answer: the request never arrived
    finally:
        srv.stop()
    log = srv.log()
    assert "timeout graceful shutdown exceeded" not in log, log
    assert "Finished server process" in log, log


@pytest.mark.parametrize(("flag", "value"), [("--header-timeout", "0"), ("--body-timeout", "nan"),
                                             ("--max-connections", "0"), ("--graceful-timeout", "-1")])
def test_bad_connection_limits_are_one_line(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from aiayn.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--checkpoint", "does-not-matter", flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"aiayn serve: error: {flag}:"), err
