"""Fixtures for the serving tests: a tiny checkpoint and a real `aiayn serve` subprocess.

The server is started the same way as by benchmarks/serve_load.py (whose helpers these
are), on a free loopback port.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]

# Limits of the shared test server, small enough to hit in tests.
MAX_TEXTS = 8
MAX_CHARS = 300
MAX_BODY_BYTES = 16_384
MAX_ATTENTION_VALUES = 100_000


def _load_serve_load() -> ModuleType:
    name = "aiayn_bench_serve_load"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "serve_load.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def serve_load() -> ModuleType:
    return _load_serve_load()


@pytest.fixture(scope="session")
def tiny_checkpoint(serve_load: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return serve_load.make_tiny_checkpoint(tmp_path_factory.mktemp("serve_ckpt"))


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
