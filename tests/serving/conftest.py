"""Fixtures for the serving tests: a tiny checkpoint and a real `aiayn serve` subprocess.

The server is started the same way as by benchmarks/serve_load.py (whose helpers these
are), on a free loopback port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from tests.tiny_world import SERVING

import serve_load as serve_load_module

# Limits of the shared test server, small enough to hit in tests.
MAX_TEXTS = 8
MAX_CHARS = 300
MAX_BODY_BYTES = 16_384
MAX_ATTENTION_VALUES = 100_000


@pytest.fixture(scope="session")
def serve_load() -> ModuleType:
    return serve_load_module


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_checkpoints: Callable[..., Path]) -> Path:
    """The serving tests' checkpoint: the toy task's word model (tests/tiny_world.py, ``SERVING``)."""
    return tiny_checkpoints(**SERVING)


@pytest.fixture(scope="session")
def sentences(tiny_checkpoint: Path) -> list[str]:
    return (tiny_checkpoint.parent / "sentences.txt").read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="session")
def server(serve_load: ModuleType, tiny_checkpoint: Path) -> Iterator:
    """One server for the HTTP and browser tests (one torch thread: CI has two cores)."""
    with serve_load.start_server(
        tiny_checkpoint, "--threads", "1", "--max-texts", str(MAX_TEXTS), "--max-chars", str(MAX_CHARS),
        "--max-body-bytes", str(MAX_BODY_BYTES), "--max-attention-values", str(MAX_ATTENTION_VALUES),
    ) as srv:
        srv.limits = {"max_texts": MAX_TEXTS, "max_chars": MAX_CHARS, "max_body_bytes": MAX_BODY_BYTES}
        yield srv


# The key of `keyed_server`, given through the environment as a deployment would.
API_KEY = "test-key-6f1d2c"
CORS_ORIGIN = "https://page.example"


@pytest.fixture(scope="session")
def keyed_server(serve_load: ModuleType, tiny_checkpoint: Path) -> Iterator:
    """A server with an API key (from $AIAYN_API_KEY), one CORS origin and the access log."""
    srv = serve_load.launch_server(tiny_checkpoint, "--threads", "1", "--cors-origin", CORS_ORIGIN, "--access-log",
                                   env={"AIAYN_API_KEY": API_KEY})
    try:
        srv.api_key = API_KEY
        srv.cors_origin = CORS_ORIGIN
        yield srv
    finally:
        srv.stop()
