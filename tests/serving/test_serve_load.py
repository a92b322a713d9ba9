"""Bounded load test on loopback (slow: `make test-slow`): 16 concurrent clients, 1,000
requests, against `aiayn serve` with and without dynamic batching: every request answered,
each with the translation the Python API gives. How fast, and whether batching pays off,
is measured by `python benchmarks/serve_load.py` (the same code; figures in
docs/results.md), not asserted here."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")

CLIENTS = 16
REQUESTS = 1000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_load_16_clients_1000_requests_no_failures(serve_load, tiny_checkpoint: Path, sentences: list[str]) -> None:
    from aiayn.inference.translator import Translator

    expected = dict(zip(sentences, Translator.from_checkpoint(tiny_checkpoint).translate(sentences), strict=True))
    results = []
    for label, flags in (("dynamic batching", []), ("one at a time", ["--no-batching"])):
        with serve_load.start_server(tiny_checkpoint, "--threads", "1", *flags) as srv:
            result = serve_load.run_load(srv.url, sentences, requests=REQUESTS, clients=CLIENTS, label=label,
                                         expected=expected)
            # Every request answered, with the right translations (else "wrong_translation").
            assert result.status_codes == {"200": REQUESTS}, (result.status_codes, srv.log())
            assert result.failures == 0
            results.append(result)
    print("\n" + serve_load.markdown(results))
    batched, single = results
    assert single.mean_batch_sentences == 1.0  # --no-batching: one sentence per model call
    assert batched.mean_batch_sentences >= 1.0
