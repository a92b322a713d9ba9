"""Fuzzing the HTTP request path of `aiayn serve` through the ASGI app (a real tiny
translator): arbitrary bodies, JSON values, field values and content types. Never a 500,
every error is JSON ``{error, message}``, nothing is logged as an error, and an answered
request gets one translation per text (with the checkpoint's decoding options, the ones the
Python API gives)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

FIELDS = ["texts", "beam", "nbest", "attention", "lenpen", "max_len_a", "max_len_b", "min_len",
          "no_repeat_ngram_size", "sampling", "temperature", "top_k", "top_p", "seed", "lenpen_style", "typo"]


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, _Errors, Any]]:
    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config, DecodeConfig, model_preset
    from aiayn.inference.translator import Translator
    from aiayn.model import build_model
    from aiayn.serving.app import ServeSettings, create_app
    from aiayn.text.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("fuzz_http")
    words = "a dog cat sees the red ball runs".split()
    sents = [" ".join(words[(i + j) % len(words)] for j in range(3 + i % 4)) for i in range(60)]
    tok = train_tokenizer(sents, sents, root / "spm", vocab_size=30, joint=True, model_type="word")
    cfg = Config(model=model_preset("tiny", src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size,
                                    max_positions=32),
                 decode=DecodeConfig(beam=2, max_len_a=0.0, max_len_b=3))
    torch.manual_seed(0)
    ck = save_checkpoint(root / "ck", build_model(cfg.model).eval(), cfg, tokenizer=tok, state={"step": 1})
    translator = Translator.from_checkpoint(ck)
    app = create_app(translator, ServeSettings(max_texts=4, max_chars=200,
                                                                   max_body_bytes=4096, max_attention_values=5000))
    errors = _Errors()
    logging.getLogger("aiayn").addHandler(errors)
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            yield c, errors, translator
    finally:
        logging.getLogger("aiayn").removeHandler(errors)


def check_request(client: tuple[TestClient, _Errors, Any], body: bytes, content_type: str | None) -> None:
    c, errors, translator = client
    headers = {"content-type": content_type} if content_type is not None else {}
    r = c.post("/v1/translate", content=body, headers=headers)
    assert r.status_code < 500, (r.status_code, r.text, body)
    if r.status_code >= 400:
        payload = r.json()
        assert set(payload) >= {"error", "message"} and payload["message"], payload
    else:
        request, answer = json.loads(body), r.json()
        texts = request["texts"]
        assert len(answer["translations"]) == len(answer["scores"]) == len(texts)
        if "nbest" in answer:  # present when nbest > 1
            assert [hyps[0]["text"] for hyps in answer["nbest"]] == answer["translations"]
        if set(request) <= {"texts", "nbest", "attention"}:  # the checkpoint's decoding options
            assert answer["translations"] == translator.translate(texts)
    assert not errors.records, [rec.getMessage() for rec in errors.records]


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=20)),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=10)
field_values = st.one_of(json_values, st.integers(-3, 70), st.sampled_from([0.0, 1e308, -1e-308, "4", "greedy"]))
texts = st.lists(st.text(max_size=60), min_size=0, max_size=5)
requests = st.one_of(
    st.fixed_dictionaries({"texts": texts}),
    st.fixed_dictionaries({"texts": texts}, optional={f: field_values for f in FIELDS[1:]}),
    st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=5),
    json_values)


def _encode(value: object) -> bytes:
    # NaN/Infinity as Python writes them (not JSON, but clients send them); lone surrogates kept.
    return json.dumps(value).encode("utf-8", "surrogatepass")


bodies = st.one_of(requests.map(_encode), st.binary(max_size=300),
                   st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n))
content_types = st.one_of(st.none(), st.sampled_from(["application/json", "application/json; charset=utf-8",
                                                      "text/plain", "application/x-www-form-urlencoded",
                                                      "application/vnd.api+json", "", "multipart/form-data"]),
                          st.text(max_size=20).filter(lambda t: t.isprintable() and t.isascii()))


@pytest.fixture
def http_test(fuzz, client):
    return fuzz(lambda body, ctype: check_request(client, body, ctype), bodies, content_types)


def test_translate_endpoint(http_test) -> None:
    http_test[0]()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_translate_endpoint_long(http_test) -> None:
    http_test[1]()
