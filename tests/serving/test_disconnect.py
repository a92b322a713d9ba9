"""A client that disconnects while its request waits in the queue: the request is dropped
before translation (TranslationService.translate with ``disconnected``), driven by events."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")

from aiayn.config import DecodeConfig  # noqa: E402
from aiayn.inference.results import Hypothesis, TranslationResult  # noqa: E402
from aiayn.serving.app import APIError, ServeSettings, TranslationService  # noqa: E402
from aiayn.serving.metrics import ServerMetrics  # noqa: E402
from aiayn.serving.schemas import TranslateRequest  # noqa: E402


class Gated:
    """Upper-cases its input; the first call blocks until ``gate`` is set."""

    config = None
    max_src_len = None

    def __init__(self) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        self.calls: list[list[str]] = []

    def decode_config(self, **overrides: Any) -> DecodeConfig:
        return DecodeConfig().with_overrides(**overrides)

    def translate_detailed(self, texts: Sequence[str], nbest: int = 1, attention: bool = False,
                           **overrides: Any) -> list[TranslationResult]:
        self.calls.append(list(texts))
        self.entered.set()
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        return [TranslationResult(t, [Hypothesis(t.upper(), [4], -1.0, [t, "</s>"], [t.upper(), "</s>"])])
                for t in texts]

    def run(self, request: Any) -> list[TranslationResult]:
        return self.translate_detailed(request.texts, request.decode.nbest, request.attention)

    def encode_sources(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[list[str]]:
        return [[*t.split(), "</s>"] for t in texts]

    def source_lengths(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[int]:
        return [len(t.split()) + 1 for t in texts]


def test_a_request_whose_client_left_is_dropped_from_the_queue() -> None:
    translator = Gated()
    metrics = ServerMetrics()
    service = TranslationService(translator, ServeSettings(batch_window_ms=0), metrics)  # type: ignore[arg-type]
    service.batcher.start()

    async def scenario() -> tuple[dict[str, Any], APIError, dict[str, Any]]:
        first = asyncio.create_task(service.translate(TranslateRequest(texts=["first"])))
        assert await asyncio.to_thread(translator.entered.wait, 60)  # the model is busy
        left = asyncio.Event()
        gone = asyncio.create_task(service.translate(TranslateRequest(texts=["gone"]), disconnected=left.wait))
        stays = asyncio.create_task(service.translate(TranslateRequest(texts=["stays"]),
                                                      disconnected=asyncio.Event().wait))
        for _ in range(10_000):  # both queued: each task ran up to its first await
            if service.batcher.depth == 2:
                break
            await asyncio.sleep(0)
        assert service.batcher.depth == 2
        left.set()  # the client of "gone" disconnects
        with pytest.raises(APIError) as err:
            await gone
        assert service.batcher.depth == 1
        translator.gate.set()
        return await first, err.value, await stays

    try:
        first, error, stays = asyncio.run(scenario())
    finally:
        service.batcher.close()
    assert (error.status, error.code) == (499, "client_closed_request")
    assert first["translations"] == ["FIRST"] and stays["translations"] == ["STAYS"]
    assert translator.calls == [["first"], ["stays"]]  # "gone" never reached the model


def _until(condition: Any, what: str, deadline_s: float = 60.0) -> None:
    """Wait for ``condition()`` (polled), failing after ``deadline_s``: a bound, not a timing."""
    import time

    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"still waiting for {what}"
        time.sleep(0.01)


def test_closing_the_socket_drops_the_queued_request() -> None:
    """The same through uvicorn: the client of a queued request closes its socket."""
    import socket

    uvicorn = pytest.importorskip("uvicorn")
    from aiayn.serving.app import create_app

    translator = Gated()
    app = create_app(translator, ServeSettings(batch_window_ms=0))  # type: ignore[arg-type]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    _until(lambda: server.started, "the server to start")

    def post(text: str) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        body = b'{"texts": ["%s"]}' % text.encode()
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        return sock

    batcher = app.state.service.batcher
    try:
        first = post("first")
        assert translator.entered.wait(timeout=60)
        gone = post("gone")
        _until(lambda: batcher.depth == 1, "the second request to be queued")
        gone.close()
        _until(lambda: batcher.depth == 0, "the queued request to be dropped")
        translator.gate.set()
        assert first.recv(65536).startswith(b"HTTP/1.1 200 ")
        first.close()
    finally:
        translator.gate.set()
        server.should_exit = True
        thread.join(timeout=60)
    assert translator.calls == [["first"]]
