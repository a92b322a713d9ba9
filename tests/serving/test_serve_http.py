"""HTTP tests against a real `aiayn serve` (uvicorn in a subprocess, loopback, free port)."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")

TIMEOUT = 120.0
# The shared server's limits (tests/serving/conftest.py starts it with these).
MAX_TEXTS, MAX_CHARS, MAX_BODY_BYTES = 8, 300, 16_384


def post(server, body, **kw) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/translate", json=body, timeout=TIMEOUT, **kw)


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of the Prometheus text (0 when absent), parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def scrape(server) -> str:
    r = httpx.get(f"{server.url}/metrics", timeout=TIMEOUT)
    assert r.status_code == 200
    return r.text


@pytest.fixture(scope="module")
def api(tiny_checkpoint: Path):
    """The Python API on the server's checkpoint: the reference for what it serves."""
    from aiayn.inference.translator import Translator

    return Translator.from_checkpoint(tiny_checkpoint)


@pytest.fixture
def reference(api, one_thread):
    """``reference(texts, **kw)``: Translator.translate_detailed on one thread, as the server runs."""
    return api.translate_detailed


# ------------------------------------------------------------------ happy paths


# Quick decoding for requests that only test the limits.
QUICK = {"beam": 1, "max_len_a": 0.0, "max_len_b": 1}


def test_limits_accept_the_limit_and_refuse_one_more(server, sentences: list[str]) -> None:
    """Each limit the server was started with (conftest: --max-texts 8, --max-chars 300,
    --max-body-bytes 16384), observed: a request at the limit is served, one over it is
    refused with the documented status and code."""
    ok = post(server, {"texts": ["a b"] * MAX_TEXTS, **QUICK})
    assert ok.status_code == 200 and len(ok.json()["translations"]) == MAX_TEXTS
    r = post(server, {"texts": ["a b"] * (MAX_TEXTS + 1), **QUICK})
    assert (r.status_code, r.json()["error"]) == (422, "too_many_texts")

    text = " ".join(sentences)[:MAX_CHARS].strip()
    text += "x" * (MAX_CHARS - len(text))  # exactly MAX_CHARS characters
    assert len(text) == MAX_CHARS
    assert post(server, {"texts": [text], **QUICK}).status_code == 200
    r = post(server, {"texts": [text + "x"], **QUICK})
    assert (r.status_code, r.json()["error"]) == (422, "text_too_long")

    body = json.dumps({"texts": ["a b"], **QUICK}).encode()
    exact = body + b" " * (MAX_BODY_BYTES - len(body))  # JSON allows trailing whitespace
    headers = {"Content-Type": "application/json"}
    r = httpx.post(f"{server.url}/v1/translate", content=exact, headers=headers, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{server.url}/v1/translate", content=exact + b" ", headers=headers, timeout=TIMEOUT)
    assert (r.status_code, r.json()["error"]) == (413, "body_too_large")


def test_health_and_model_info(server, tiny_checkpoint: Path) -> None:
    from aiayn.checkpoint.directory import load_checkpoint

    r = httpx.get(f"{server.url}/health", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    info = httpx.get(f"{server.url}/v1/model", timeout=TIMEOUT).json()
    loaded = load_checkpoint(tiny_checkpoint)
    assert info["languages"] == {"source": "en", "target": "xx"}
    assert info["config"]["model"]["n_heads"] == 4
    assert info["vocabulary"] == {"source": loaded.tokenizer.src_vocab_size, "target": loaded.tokenizer.tgt_vocab_size,
                                  "joint": True}
    assert info["vocabulary"]["source"] == info["config"]["model"]["src_vocab_size"]
    # The checkpoint's unique parameters (the tied embedding and projection counted once).
    assert info["parameters"]["parameters"] == sum(p.numel() for p in loaded.model.parameters())
    assert info["parameters"]["parameters"] == sum(v for k, v in info["parameters"].items() if k != "parameters")
    assert info["limits"] == {"max_texts": MAX_TEXTS, "max_chars": MAX_CHARS, "max_body_bytes": MAX_BODY_BYTES,
                              "max_positions": loaded.config.model.max_positions}
    assert info["batching"]["enabled"] is True
    assert info["dtype"] == "fp32"  # --dtype auto as resolved ($AIAYN_DTYPE pins it in the tests)


def test_translate_happy_path(server, sentences: list[str], reference) -> None:
    """The served translations and scores are Translator.translate_detailed's for the same
    texts on the same checkpoint (the same fp32 path: scores to 1e-5)."""
    texts = sentences[:3]
    r = post(server, {"texts": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"translations", "scores"}  # n-best and attention only when asked
    expected = reference(texts)
    assert body["translations"] == [res.best.text for res in expected]
    assert body["scores"] == pytest.approx([res.best.score for res in expected], abs=1e-5, rel=0)
    again = post(server, {"texts": texts}).json()
    assert again == body  # deterministic
    # Decoding options in the request are the API's keyword overrides.
    options = {"beam": 2, "lenpen": 1.0, "max_len_a": 0.5, "max_len_b": 3}
    body = post(server, {"texts": texts, **options}).json()
    expected = reference(texts, **options)
    assert body["translations"] == [res.best.text for res in expected]
    assert body["scores"] == pytest.approx([res.best.score for res in expected], abs=1e-5, rel=0)


def test_translations_come_back_in_input_order(server, sentences: list[str]) -> None:
    # Different lengths, so a batch is padded and any reordering would show in the labels.
    texts = sorted(sentences[:6], key=len, reverse=True)[:2] + sorted(sentences[:6], key=len)[:2]
    body = post(server, {"texts": texts, "attention": True}).json()
    assert len(body["attention"]) == len(texts)
    for text, att in zip(texts, body["attention"]):
        # A word tokenizer: one piece per word ("▁" marks the space before it), then </s>.
        assert [p.lstrip("▁") for p in att["src_tokens"][:-1]] == text.split()
        assert att["src_tokens"][-1] == "</s>"
    plain = post(server, {"texts": texts}).json()
    assert plain["translations"] == body["translations"]


def test_nbest(server, sentences: list[str], reference) -> None:
    body = post(server, {"texts": sentences[:2], "beam": 4, "nbest": 3}).json()
    assert len(body["nbest"]) == 2
    expected = reference(sentences[:2], nbest=3, beam=4)
    for best, cands, res in zip(body["translations"], body["nbest"], expected):
        assert len(cands) == 3
        assert cands[0]["text"] == best
        scores = [c["score"] for c in cands]
        assert scores == sorted(scores, reverse=True)
        assert [c["text"] for c in cands] == [h.text for h in res.hypotheses]
        assert scores == pytest.approx([h.score for h in res.hypotheses], abs=1e-5, rel=0)


def test_attention_payload_shape(server, sentences: list[str], reference) -> None:
    body = post(server, {"texts": sentences[:2], "attention": True, "beam": 2}).json()
    expected = reference(sentences[:2], attention=True, beam=2)
    for att, res in zip(body["attention"], expected):
        # The API's pieces and weights, rounded to the 4 decimals the server sends.
        assert (att["src_tokens"], att["tgt_tokens"]) == (res.best.src_pieces, res.best.tgt_pieces)
        torch.testing.assert_close(torch.tensor(att["weights"]), res.best.attention, atol=5e-5 + 1e-6, rtol=0)
        n_src, n_tgt = len(att["src_tokens"]), len(att["tgt_tokens"])
        assert (att["layers"], att["heads"]) == (2, 4)  # the tiny preset's decoder
        w = att["weights"]
        assert len(w) == 2 and all(len(layer) == 4 for layer in w)
        for layer in w:
            for head in layer:
                assert len(head) == n_tgt
                for row in head:
                    assert len(row) == n_src
                    assert abs(sum(row) - 1.0) < 1e-3 * n_src  # a softmax over the source, rounded


def test_docs_and_openapi(server) -> None:
    assert httpx.get(f"{server.url}/docs", timeout=TIMEOUT).status_code == 200
    schema = httpx.get(f"{server.url}/openapi.json", timeout=TIMEOUT).json()
    assert "/v1/translate" in schema["paths"]
    assert "TranslateRequest" in schema["components"]["schemas"]


def test_page_and_static_files_are_served_without_cdn(server) -> None:
    page = httpx.get(f"{server.url}/", timeout=TIMEOUT)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in ("app.js", "style.css"):
        r = httpx.get(f"{server.url}/static/{asset}", timeout=TIMEOUT)
        assert r.status_code == 200 and len(r.text) > 100
    # Offline: every script and stylesheet comes from this server.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.text)


# ------------------------------------------------------------------ errors

LONG_TEXT = "word " * (MAX_CHARS // 5 + 1)

ERROR_CASES = {
    "malformed_json": (b'{"texts": ["a b"', "application/json", 400, "malformed_json"),
    "texts_not_a_list": ({"texts": "a sentence"}, None, 422, "invalid_request"),
    "text_not_a_string": ({"texts": ["a", 3]}, None, 422, "invalid_request"),
    "beam_as_string": ({"texts": ["a"], "beam": "4"}, None, 422, "invalid_request"),
    "beam_zero": ({"texts": ["a"], "beam": 0}, None, 422, "invalid_request"),
    "nbest_over_beam": ({"texts": ["a"], "beam": 2, "nbest": 3}, None, 422, "invalid_request"),
    "missing_texts": ({"beam": 4}, None, 422, "invalid_request"),
    "empty_texts": ({"texts": []}, None, 422, "invalid_request"),
    "body_not_an_object": ([1, 2], None, 422, "invalid_request"),
    "unknown_field": ({"texts": ["a"], "nbets": 2}, None, 422, "unknown_field"),
    "too_many_texts": ({"texts": ["a b"] * (MAX_TEXTS + 1)}, None, 422, "too_many_texts"),
    "text_too_long": ({"texts": ["a b", LONG_TEXT]}, None, 422, "text_too_long"),
    "body_too_large": ({"texts": ["x" * (MAX_BODY_BYTES + 10)]}, None, 413, "body_too_large"),
    "not_json_content_type": (b'{"texts": ["a"]}', "text/plain", 415, "unsupported_media"),
    # Malformed bodies: each gets its own error code, never a 500 with a traceback, http_400 or 422.
    "lone_surrogate": (b'{"texts": ["s1 \\ud800"]}', "application/json", 400, "malformed_json"),
    "invalid_utf8": (b'{"texts": ["a \xff b"]}', "application/json", 400, "malformed_json"),
    "deeply_nested": (b'{"texts": ' + b"[" * 5_000 + b"]" * 5_000 + b"}", "application/json", 400,
                      "malformed_json"),
    "no_content_type": (b'{"texts": ["a"]}', "", 415, "unsupported_media"),
    "odd_content_type": (b'{"texts": ["a"]}', "application/x-www-form-urlencoded", 415, "unsupported_media"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_error_cases(server, case: str) -> None:
    payload, ctype, status, code = ERROR_CASES[case]
    if isinstance(payload, bytes):
        headers = {"Content-Type": ctype} if ctype else {}
        r = httpx.post(f"{server.url}/v1/translate", content=payload, headers=headers, timeout=TIMEOUT)
    else:
        r = post(server, payload)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["error"] == code
    assert isinstance(body["message"], str) and body["message"]


def test_a_bad_body_leaves_the_connection_usable(server, sentences: list[str]) -> None:
    """Regression: after a lone surrogate the client's next request on the same keep-alive
    connection was reset."""
    with httpx.Client(timeout=TIMEOUT) as client:
        bad = client.post(f"{server.url}/v1/translate", content=b'{"texts": ["s1 \\ud800"]}',
                          headers={"Content-Type": "application/json"})
        assert bad.status_code == 400 and "surrogate" in bad.json()["message"]
        good = client.post(f"{server.url}/v1/translate", json={"texts": sentences[:1]})
        assert good.status_code == 200


def test_attention_is_bounded_before_decoding(server, sentences: list[str]) -> None:
    """Regression: a 27 KB request with attention produced a 51.6 MB response. The test
    server allows 100,000 weights; 8 texts of ~40 words may return 8 x 2 layers x 4 heads x
    up to 256 output positions x ~40 source tokens."""
    text = " ".join(sentences)[:MAX_CHARS - 20]
    body = {"texts": [text] * MAX_TEXTS, "attention": True, "max_len_b": 1024}
    r = post(server, body)
    assert r.status_code == 413 and r.json()["error"] == "attention_too_large"
    assert "100,000" in r.json()["message"] and "--max-attention-values" in r.json()["message"]
    assert post(server, {**body, "attention": False, "max_len_b": 2}).status_code == 200


def test_head_health(server) -> None:
    r = httpx.head(f"{server.url}/health", timeout=TIMEOUT)
    assert r.status_code == 200 and r.content == b""


def test_error_messages_name_the_field(server) -> None:
    assert "nbets" in post(server, {"texts": ["a"], "nbets": 2}).json()["message"]
    assert "texts[1]" in post(server, {"texts": ["a", 3]}).json()["message"]
    assert "texts[1]" in post(server, {"texts": ["a", LONG_TEXT]}).json()["message"]
    assert str(MAX_TEXTS) in post(server, {"texts": ["a"] * (MAX_TEXTS + 1)}).json()["message"]


def test_chunked_body_over_the_limit_is_refused(server) -> None:
    def chunks():  # no Content-Length: the server must count what it receives
        yield b'{"texts": ["'
        for _ in range(MAX_BODY_BYTES // 1000 + 2):
            yield b"x" * 1000
        yield b'"]}'

    r = httpx.post(f"{server.url}/v1/translate", content=chunks(), headers={"Content-Type": "application/json"},
                   timeout=TIMEOUT)
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"


def test_unknown_path_and_method_are_json(server) -> None:
    r = httpx.get(f"{server.url}/v2/nothing", timeout=TIMEOUT)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = httpx.get(f"{server.url}/v1/translate", timeout=TIMEOUT)
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"


def test_a_failing_request_never_affects_the_others(server, sentences: list[str], reference) -> None:
    bad = [{"texts": ["a"], "nbets": 1}, {"texts": ["a b", LONG_TEXT]}, {"texts": "x"},
           {"texts": ["a"], "beam": 1, "nbest": 2}]
    jobs = []
    for i in range(24):
        if i % 3 == 2:
            jobs.append((bad[i % len(bad)], False))
        else:
            jobs.append(({"texts": sentences[i:i + 1 + i % 3]}, True))
    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(lambda job: post(server, job[0]), jobs))
    for (body, ok), r in zip(jobs, responses):
        if ok:
            assert r.status_code == 200, r.text
            # Batched with whatever else arrived: still these texts' own translations.
            assert r.json()["translations"] == [res.best.text for res in reference(body["texts"])]
        else:
            assert r.status_code == 422, r.text


def test_metrics_counters_move(server, sentences: list[str], api, reference) -> None:
    before = scrape(server)
    assert post(server, {"texts": sentences[:2]}).status_code == 200
    assert post(server, {"texts": ["a"], "nbets": 2}).status_code == 422
    after = scrape(server)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("aiayn_http_requests_total", code="200", path="/v1/translate") == 1
    assert delta("aiayn_http_requests_total", code="422", path="/v1/translate") == 1
    assert delta("aiayn_http_errors_total", code="unknown_field", status="422") == 1
    assert delta("aiayn_http_request_duration_seconds_count", path="/v1/translate") == 2
    assert delta("aiayn_sentences_total") == 2
    assert delta("aiayn_batches_total") == 1  # one request alone: one batch of its 2 texts
    assert delta("aiayn_batch_sentences_sum") == 2 and delta("aiayn_batch_sentences_count") == 1
    assert delta("aiayn_batch_requests_sum") == 1
    assert delta("aiayn_source_tokens_total") == sum(api.source_lengths(sentences[:2]))  # EOS included
    assert delta("aiayn_target_tokens_total") == sum(len(res.best.tokens) for res in reference(sentences[:2]))
    assert delta("aiayn_model_seconds_total") > 0
    assert metric(after, "aiayn_target_tokens_per_second") > 0
    assert "# TYPE aiayn_http_request_duration_seconds histogram" in after
    assert "# TYPE aiayn_batch_sentences histogram" in after
    assert delta("aiayn_http_request_duration_seconds_bucket", path="/v1/translate", le="+Inf") == 2


def test_concurrent_requests_are_batched(server, sentences: list[str]) -> None:
    before = scrape(server)
    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda s: post(server, {"texts": [s]}), sentences[:32]))
    assert all(r.status_code == 200 for r in responses)
    after = scrape(server)

    def delta(name: str) -> float:
        return metric(after, name) - metric(before, name)

    # 32 requests from 16 clients: the batcher must have merged some of them.
    assert delta("aiayn_batches_total") < 32
    assert delta("aiayn_batch_requests_sum") == 32 and delta("aiayn_sentences_total") == 32
    assert delta("aiayn_batch_requests_count") == delta("aiayn_batches_total")


# ------------------------------------------------------------------ overload and shutdown


@pytest.fixture(scope="module")
def one_slot_server(serve_load, tiny_checkpoint: Path):
    """No batching and a queue of one: concurrent requests overflow at once."""
    srv = serve_load.launch_server(tiny_checkpoint, "--threads", "1", "--no-batching", "--queue-size", "1")
    yield srv
    srv.stop()


# Slow on purpose (wide beam, long outputs): keeps the single worker busy.
SLOW = {"beam": 8, "max_len_a": 2.0, "max_len_b": 60}


def test_full_queue_answers_503_with_retry_after(one_slot_server, sentences: list[str]) -> None:
    srv = one_slot_server
    with ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(lambda i: post(srv, {"texts": sentences[i:i + 8], **SLOW}), range(12)))
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 503}, codes
    assert codes.count(503) >= 1 and codes.count(200) >= 2, codes
    for r in responses:
        if r.status_code == 503:
            assert r.json()["error"] == "overloaded"
            assert int(r.headers["retry-after"]) >= 1
        else:
            assert len(r.json()["translations"]) == 8
    assert metric(scrape(srv), "aiayn_queue_rejected_total") >= codes.count(503)


def test_graceful_shutdown_finishes_in_flight_requests(one_slot_server, sentences: list[str]) -> None:
    srv = one_slot_server
    result: dict[str, httpx.Response] = {}
    texts = sentences[:8]
    # Slower still: up to the model's 256 positions with a beam of 16, so that the request
    # is surely running when the signal arrives, even on a fast machine.
    slower = {"beam": 16, "max_len_a": 4.0, "max_len_b": 200}
    client = threading.Thread(target=lambda: result.update(r=post(srv, {"texts": texts, **slower})))
    client.start()
    deadline = time.monotonic() + 30
    # In flight = this scrape + the slow request.
    while metric(scrape(srv), "aiayn_http_requests_in_flight") < 2:
        assert client.is_alive(), "the request finished before the test could interrupt it"
        assert time.monotonic() < deadline, "the slow request never arrived"
        time.sleep(0.005)
    srv.proc.send_signal(15)  # SIGTERM, as a process manager would
    client.join(60)
    assert "r" in result, "the in-flight request got no answer"
    assert result["r"].status_code == 200, result["r"].text
    assert len(result["r"].json()["translations"]) == len(texts)
    # uvicorn re-raises the signal once shut down, so a clean stop exits "killed by SIGTERM".
    assert srv.proc.wait(60) in (0, -15), srv.log()
    assert "Finished server process" in srv.log() or "Shutting down" in srv.log()
    json.dumps(result["r"].json())  # a complete JSON body, not a truncated one
