"""Bounded load test on loopback (slow: `make test-slow`): 16 concurrent clients, 1,000
requests, against `aiayn serve` with and without dynamic batching. The figures in
docs/results.md come from `python benchmarks/serve_load.py`, which runs the same code."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")

CLIENTS = 16
REQUESTS = 1000


@pytest.mark.slow
def test_load_16_clients_1000_requests_no_failures(serve_load, tiny_checkpoint: Path, sentences: list[str]) -> None:
    results = []
    for label, flags in (("dynamic batching", []), ("one at a time", ["--no-batching"])):
        with serve_load.start_server(tiny_checkpoint, "--threads", "1", *flags) as srv:
            result = serve_load.run_load(srv.url, sentences, requests=REQUESTS, clients=CLIENTS, label=label)
            assert result.failures == 0, (result.status_codes, srv.log())
            assert result.status_codes == {"200": REQUESTS}
            results.append(result)
    print("\n" + serve_load.markdown(results))
    batched, single = results
    assert single.mean_batch_sentences == 1.0
    assert batched.mean_batch_sentences > 1.5
    # Batching must pay off under load; the margin is loose because CI machines are shared.
    assert batched.throughput_rps > 1.2 * single.throughput_rps
