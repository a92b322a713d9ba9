"""The server encodes each text once, with the tokenizer the request's options choose, and
translates the encoded sources as they are."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")


def test_each_text_is_encoded_once_and_translated_as_the_python_api_does(tiny_checkpoint: Path, monkeypatch,
                                                                         one_thread) -> None:
    from fastapi.testclient import TestClient

    from aiayn.inference.translator import Translator
    from aiayn.serving.app import ServeSettings, create_app
    from aiayn.text.tokenizer import Tokenizer

    texts = ["a man is riding a bike", "the dog"]
    expected = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32").translate(texts)
    translator = Translator.from_checkpoint(tiny_checkpoint, dtype="fp32")
    encoded: list[str] = []
    real = Tokenizer.encode_src_batch

    def counting(self, batch, *args, **kwargs):
        encoded.extend(batch)
        return real(self, batch, *args, **kwargs)

    monkeypatch.setattr(Tokenizer, "encode_src_batch", counting)
    with TestClient(create_app(translator, ServeSettings(batch_window_ms=0))) as client:
        r = client.post("/v1/translate", json={"texts": texts})
    assert r.status_code == 200, r.text
    assert r.json()["translations"] == expected
    assert encoded == texts  # once each, on the event loop; the worker reused the ids
