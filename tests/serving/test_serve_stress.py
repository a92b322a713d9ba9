"""Hostile and heavy load on a real `aiayn serve` (slow: `make test-slow`), with the code of
benchmarks/serve_stress.py, whose full-size figures are in docs/serving.md ("Load")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("httpx")
pytest.importorskip("psutil")
pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def stress(serve_load: ModuleType) -> ModuleType:
    sys.modules.setdefault("serve_load", serve_load)  # serve_stress imports it by name
    spec = importlib.util.spec_from_file_location("aiayn_bench_serve_stress", BENCHMARKS / "serve_stress.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_400_clients_get_answers_or_503_with_retry_after(stress: ModuleType, tiny_checkpoint: Path,
                                                         sentences: list[str]) -> None:
    # A queue of 4 for 400 clients: some requests meet a full queue even when the one client
    # process is slowed down by a busy machine (with 64, a CI run under load saw none).
    rows = stress.run_clients(tiny_checkpoint, sentences, [400], 2, ["--threads", "1", "--queue-size", "4"])
    codes = rows[0]["codes"]
    assert rows[0]["failures"] == 0, codes
    assert codes["200"] == 800 and codes.get("503 + Retry-After", 0) > 0, codes


@pytest.mark.slow
def test_slow_clients_beyond_the_cap_do_not_fail_normal_traffic(stress: ModuleType, tiny_checkpoint: Path,
                                                                sentences: list[str]) -> None:
    # More slow clients than --max-connections: the cap evicts them for newcomers.
    args = ["--threads", "1", "--header-timeout", "6", "--max-connections", "300"]  # over httpx's 5 s keep-alive
    out = stress.run_slow(tiny_checkpoint, sentences, n_slow=500, requests=300, server_args=args, byte_every_s=0.5)
    for run in ("alone", "with_slow_clients"):
        assert out[run]["failures"] == 0 and out[run]["codes"].get("200") == 300, out
    assert out["evicted"] > 0, out
    assert out["shutdown"]["exit"] == -15, out  # its own SIGTERM ended it
