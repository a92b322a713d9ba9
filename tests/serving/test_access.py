"""The API key, CORS and /metrics of the app, in-process (Starlette's TestClient) around a
scripted translator, so that every count is exact."""

from __future__ import annotations

import hmac
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
pytest.importorskip("httpx")

from prometheus_client import CONTENT_TYPE_LATEST  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from aiayn.config import DecodeConfig  # noqa: E402
from aiayn.errors import ConfigError  # noqa: E402
from aiayn.inference.results import Hypothesis, TranslationResult  # noqa: E402
from aiayn.serving.app import ServeSettings, create_app  # noqa: E402
from aiayn.serving.auth import check_api_key, check_cors_origin, presented_keys  # noqa: E402

KEY = "s3cret-key"
ORIGIN = "https://page.example"


class Upper:
    """A translator that upper-cases its input: no model, instant and exact."""

    config = None
    max_src_len = None

    def decode_config(self, **overrides: Any) -> DecodeConfig:
        return DecodeConfig().with_overrides(**overrides)

    def translate(self, texts: Sequence[str], **overrides: Any) -> list[str]:
        return [t.upper() for t in texts]

    def translate_detailed(self, texts: Sequence[str], nbest: int = 1, attention: bool = False,
                           **overrides: Any) -> list[TranslationResult]:
        return [TranslationResult(t, [Hypothesis(t.upper(), [4] * len(t.split()), -1.0, [*t.split(), "</s>"],
                                                 [*t.upper().split(), "</s>"])]) for t in texts]

    def run(self, request: Any) -> list[TranslationResult]:
        return self.translate_detailed(request.texts, request.decode.nbest, request.attention)

    def encode_sources(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[list[str]]:
        return [[*t.split(), "</s>"] for t in texts]

    def source_lengths(self, texts: Sequence[str], cfg: DecodeConfig | None = None) -> list[int]:
        return [len(t.split()) + 1 for t in texts]

    def describe(self) -> dict[str, Any]:
        return {"languages": {"source": "en", "target": "xx"}}


def _client(**settings: Any) -> Iterator[TestClient]:
    with TestClient(create_app(Upper(), ServeSettings(**settings)), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def plain() -> Iterator[TestClient]:
    yield from _client()


@pytest.fixture
def keyed() -> Iterator[TestClient]:
    yield from _client(api_key=KEY)


@pytest.fixture
def cors() -> Iterator[TestClient]:
    yield from _client(api_key=KEY, cors_origins=(ORIGIN,))


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, parsed by prometheus_client's own parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(client: TestClient, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST
    return samples(r.text)


BEARER = {"Authorization": f"Bearer {KEY}"}
PROTECTED = [("GET", "/v1/model"), ("POST", "/v1/translate"), ("GET", "/metrics"), ("GET", "/nowhere"),
             ("GET", "/v1/model/")]
OPEN = ["/health", "/", "/static/app.js", "/static/style.css", "/docs", "/openapi.json"]


# ------------------------------------------------------------------ API key


@pytest.mark.parametrize(("method", "path"), PROTECTED)
def test_without_the_key_every_protected_path_is_401(keyed: TestClient, method: str, path: str) -> None:
    r = keyed.request(method, path, json={"texts": ["a b"]} if method == "POST" else None)
    assert r.status_code == 401, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"error": "unauthorized", "message": "this endpoint needs the server's API key: send "
                        "'Authorization: Bearer KEY' or 'X-API-Key: KEY'"}
    assert r.headers["www-authenticate"] == 'Bearer realm="aiayn"'


@pytest.mark.parametrize("headers", [{"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"},
                                     {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"},
                                     {"X-API-Key": KEY[:-1]}])
def test_a_wrong_key_is_401(keyed: TestClient, headers: dict[str, str]) -> None:
    r = keyed.get("/v1/model", headers=headers)
    assert r.status_code == 401
    assert r.json()["error"] == "unauthorized"
    if headers.get("Authorization", "").startswith("Basic"):  # no bearer token: as if no key were sent
        assert r.headers["www-authenticate"] == 'Bearer realm="aiayn"'
    else:
        assert r.json()["message"] == "the API key is not valid"
        assert r.headers["www-authenticate"] == 'Bearer realm="aiayn", error="invalid_token"'


@pytest.mark.parametrize("headers", [BEARER, {"Authorization": f"bearer {KEY}"}, {"X-API-Key": KEY},
                                     {"Authorization": "Bearer wrong", "X-API-Key": KEY}])
def test_the_right_key_is_accepted(keyed: TestClient, headers: dict[str, str]) -> None:
    assert keyed.get("/v1/model", headers=headers).status_code == 200
    r = keyed.post("/v1/translate", json={"texts": ["a b", "c"]}, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == ["A B", "C"]
    assert keyed.get("/metrics", headers=headers).status_code == 200


@pytest.mark.parametrize("path", OPEN)
def test_health_page_and_docs_need_no_key(keyed: TestClient, path: str) -> None:
    assert keyed.get(path).status_code == 200


def test_head_health_needs_no_key(keyed: TestClient) -> None:
    assert keyed.head("/health").status_code == 200


def test_keys_are_compared_in_constant_time(keyed: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert keyed.get("/v1/model", headers={"X-API-Key": "wrong"}).status_code == 401
    assert keyed.get("/v1/model", headers={"X-API-Key": KEY}).status_code == 200
    assert len(calls) == 2
    # SHA-256 digests on both sides: the comparison's time depends on neither key's length.
    assert all(len(a) == len(b) == 32 for a, b in calls)


def test_refused_requests_are_counted(keyed: TestClient) -> None:
    for _ in range(3):
        keyed.get("/v1/model")
    keyed.post("/v1/translate", json={"texts": ["a"]}, headers={"X-API-Key": "nope"})
    got = scrape(keyed, **BEARER)
    assert got[("aiayn_http_errors_total", (("code", "unauthorized"), ("status", "401")))] == 4
    assert got[("aiayn_http_requests_total", (("code", "401"), ("path", "/v1/model")))] == 3
    assert got[("aiayn_http_requests_total", (("code", "401"), ("path", "/v1/translate")))] == 1


def test_the_openapi_schema_declares_the_key(keyed: TestClient, plain: TestClient) -> None:
    schema = keyed.get("/openapi.json").json()
    assert {s["type"] for s in schema["components"]["securitySchemes"].values()} == {"http", "apiKey"}
    assert len(schema["paths"]["/v1/translate"]["post"]["security"]) == 2  # either header
    assert "401" in schema["paths"]["/v1/model"]["get"]["responses"]
    assert "security" not in schema["paths"]["/health"]["get"]
    assert "securitySchemes" not in plain.get("/openapi.json").json().get("components", {})


def test_without_a_key_nothing_is_protected(plain: TestClient) -> None:
    assert plain.get("/v1/model").status_code == 200
    assert plain.post("/v1/translate", json={"texts": ["a"]}).json()["translations"] == ["A"]


def test_presented_keys() -> None:
    headers = [(b"authorization", b"Bearer  k1 "), (b"x-api-key", b" k2"), (b"authorization", b"Basic k3"),
               (b"x-api-key", b""), (b"other", b"k4")]
    assert presented_keys(headers) == [b"k1", b"k2"]


@pytest.mark.parametrize(("key", "problem"), [("", "empty"), ("two words", "printable ASCII"),
                                              (" padded", "printable ASCII"), ("clé", "printable ASCII")])
def test_unusable_keys_are_refused(key: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"^--api-key: .*{problem}"):
        check_api_key(key)
    with pytest.raises(ConfigError, match="ServeSettings.api_key"):
        create_app(Upper(), ServeSettings(api_key=key))


# ------------------------------------------------------------------ CORS

PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


def test_preflight_from_an_allowed_origin(cors: TestClient) -> None:
    r = cors.options("/v1/translate", headers={"Origin": ORIGIN, **PREFLIGHT})
    assert r.status_code == 200  # no key needed: browsers never send one with a preflight
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-api-key"} <= allowed
    assert "access-control-allow-credentials" not in r.headers


def test_preflight_from_another_origin_is_not_allowed(cors: TestClient) -> None:
    r = cors.options("/v1/translate", headers={"Origin": "https://evil.example", **PREFLIGHT})
    assert "access-control-allow-origin" not in r.headers


def test_answers_to_an_allowed_origin_carry_cors_headers(cors: TestClient) -> None:
    ok = cors.post("/v1/translate", json={"texts": ["a"]}, headers={"Origin": ORIGIN, **BEARER})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    # A 401 too, so that the page can read why it was refused.
    refused = cors.post("/v1/translate", json={"texts": ["a"]}, headers={"Origin": ORIGIN})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN
    other = cors.get("/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_any_origin() -> None:
    for c in _client(cors_origins=("*",)):
        r = c.options("/v1/translate", headers={"Origin": "https://anywhere.example", **PREFLIGHT})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


def test_without_cors_origins_there_are_no_cors_headers(plain: TestClient) -> None:
    r = plain.post("/v1/translate", json={"texts": ["a"]}, headers={"Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    preflight = plain.options("/v1/translate", headers={"Origin": ORIGIN, **PREFLIGHT})
    assert preflight.status_code == 405 and "access-control-allow-origin" not in preflight.headers


@pytest.mark.parametrize(("given", "expected"), [("*", "*"), ("https://page.example", "https://page.example"),
                                                 ("HTTP://Page.Example:8080", "http://page.example:8080"),
                                                 ("http://[::1]:3000", "http://[::1]:3000")])
def test_cors_origins_as_browsers_send_them(given: str, expected: str) -> None:
    assert check_cors_origin(given) == expected


@pytest.mark.parametrize(("origin", "problem"), [("page.example", "not an origin"),
                                                 ("https://page.example/", "no path"),
                                                 ("https://page.example/app", "no path"),
                                                 ("https://u@page.example", "no path, query or user"),
                                                 ("https://page.example:port", "not an origin"),
                                                 ("null", "not an origin"), ("", "not an origin")])
def test_bad_cors_origins_are_refused(origin: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"^--cors-origin: .*{problem}"):
        check_cors_origin(origin)


# ------------------------------------------------------------------ metrics


def test_metrics_count_exactly(plain: TestClient) -> None:
    for texts in (["a b"], ["c", "d e f"], ["g"]):
        assert plain.post("/v1/translate", json={"texts": texts}).status_code == 200
    assert plain.post("/v1/translate", json={"texts": ["a"], "nbets": 2}).status_code == 422
    assert plain.get("/health").status_code == 200
    first = scrape(plain)
    got = scrape(plain)
    assert got[("aiayn_http_requests_total", (("code", "200"), ("path", "/v1/translate")))] == 3
    assert got[("aiayn_http_requests_total", (("code", "422"), ("path", "/v1/translate")))] == 1
    assert got[("aiayn_http_requests_total", (("code", "200"), ("path", "/health")))] == 1
    # A scrape is counted once it has been answered: the first one shows in the second.
    assert ("aiayn_http_requests_total", (("code", "200"), ("path", "/metrics"))) not in first
    assert got[("aiayn_http_requests_total", (("code", "200"), ("path", "/metrics")))] == 1
    assert got[("aiayn_http_errors_total", (("code", "unknown_field"), ("status", "422")))] == 1
    assert got[("aiayn_http_request_duration_seconds_count", (("path", "/v1/translate"),))] == 4
    assert got[("aiayn_http_request_duration_seconds_bucket", (("le", "+Inf"), ("path", "/v1/translate")))] == 4
    # One request at a time: one batch each.
    assert got[("aiayn_batches_total", ())] == 3
    assert got[("aiayn_batch_sentences_sum", ())] == 4
    assert got[("aiayn_sentences_total", ())] == 4
    assert got[("aiayn_source_tokens_total", ())] == (2 + 1) + (1 + 1) + (3 + 1) + (1 + 1)
    assert got[("aiayn_target_tokens_total", ())] == 2 + 1 + 3 + 1
    assert got[("aiayn_http_requests_in_flight", ())] == 1  # this scrape
    assert got[("aiayn_queue_requests", ())] == 0
    assert got[("aiayn_batch_failures_total", ())] == 0


def test_process_and_platform_metrics(plain: TestClient) -> None:
    got = scrape(plain)
    assert got[("process_resident_memory_bytes", ())] > 0
    assert got[("process_open_fds", ())] > 0
    assert ("process_cpu_seconds_total", ()) in got
    assert any(name == "python_info" for name, _ in got)


def test_two_apps_count_separately() -> None:
    for one in _client():
        for two in _client():
            one.post("/v1/translate", json={"texts": ["a", "b"]})
            assert scrape(one)[("aiayn_sentences_total", ())] == 2
            assert scrape(two)[("aiayn_sentences_total", ())] == 0
