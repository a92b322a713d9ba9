"""Hostile and heavy load on a real `aiayn serve` (slow: `make test-slow`), with the code of
benchmarks/serve_stress.py, whose full-size figures are in docs/serving.md ("Load"): every
client answered, none failed. Whether a given load meets a full queue depends on the
machine's speed, so the 503 path is forced here with the model call held on a gate (a queue
of one and a blocked worker), and eviction at the connection cap in test_connections.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("httpx")
pytest.importorskip("psutil")
pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")


@pytest.fixture(scope="module")
def stress() -> ModuleType:
    import serve_stress

    return serve_stress


def test_a_full_queue_answers_503_with_retry_after(tiny_checkpoint: Path, sentences: list[str]) -> None:
    from starlette.testclient import TestClient

    from aiayn.inference.translator import Translator
    from aiayn.serving.app import ServeSettings, create_app

    translator = Translator.from_checkpoint(tiny_checkpoint)
    expected = [translator.translate([text]) for text in sentences[:2]]
    entered, release = threading.Event(), threading.Event()
    translate = translator.run

    def gated(*args, **kwargs):  # the model call waits for the test
        entered.set()
        assert release.wait(60), "the test never released the model"
        return translate(*args, **kwargs)

    translator.run = gated  # type: ignore[method-assign]
    app = create_app(translator, ServeSettings(queue_size=1, batching=False))
    with TestClient(app) as client, ThreadPoolExecutor(2) as pool:
        def post(text: str):
            return client.post("/v1/translate", json={"texts": [text]})

        running = pool.submit(post, sentences[0])
        assert entered.wait(60), "the first request never reached the model"
        queued = pool.submit(post, sentences[1])
        deadline = time.monotonic() + 60
        while app.state.service.batcher.depth < 1:  # the second one waits in the queue of one
            assert time.monotonic() < deadline, "the second request never reached the queue"
            time.sleep(0.01)
        refused = post(sentences[2])
        release.set()
        answered = [running.result(60), queued.result(60)]
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"] == "overloaded" and refused.headers["retry-after"] == "1"
    assert [r.status_code for r in answered] == [200, 200]
    assert [r.json()["translations"] for r in answered] == expected


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_400_clients_get_answers_or_503_with_retry_after(stress: ModuleType, tiny_checkpoint: Path,
                                                         sentences: list[str]) -> None:
    # A queue of 4 for 400 clients: a client meeting the full queue gets 503 with Retry-After
    # and sends again after it; anything else is a failure. Every request ends answered.
    rows = stress.run_clients(tiny_checkpoint, sentences, [400], 2, ["--threads", "1", "--queue-size", "4"])
    codes = rows[0]["codes"]
    assert rows[0]["failures"] == 0, codes
    assert set(codes) <= {"200", "503 + Retry-After"} and codes["200"] == 800, codes


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_slow_clients_beyond_the_cap_do_not_fail_normal_traffic(stress: ModuleType, tiny_checkpoint: Path,
                                                                sentences: list[str]) -> None:
    # More slow clients than --max-connections: the cap evicts them for newcomers.
    args = ["--threads", "1", "--header-timeout", "6", "--max-connections", "300"]  # over httpx's 5 s keep-alive
    out = stress.run_slow(tiny_checkpoint, sentences, n_slow=500, requests=300, server_args=args, byte_every_s=0.5)
    for run in ("alone", "with_slow_clients"):
        assert out[run]["failures"] == 0 and out[run]["codes"].get("200") == 300, out
    # 500 slow clients for 300 connections: the cap was met (newcomers evicted a slow client
    # or were refused); which of the two depends on timing, both keep normal traffic going.
    assert out["evicted"] + out["rejected"] > 0, out
    assert out["shutdown"]["exit"] == -15, out  # its own SIGTERM ended it
