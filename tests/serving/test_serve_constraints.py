"""Terminology through POST /v1/translate, in-process (Starlette's TestClient) around the
tiny checkpoint: the fields, their round trip to the Python API, and bad requests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from aiayn.inference.translator import Translator  # noqa: E402
from aiayn.serving.app import ServeSettings, create_app  # noqa: E402


@pytest.fixture(scope="module")
def translator(tiny_checkpoint: Path) -> Translator:
    return Translator.from_checkpoint(tiny_checkpoint)


@pytest.fixture(scope="module")
def client(translator: Translator) -> Iterator[TestClient]:
    with TestClient(create_app(translator, ServeSettings()), raise_server_exceptions=False) as c:
        yield c


def test_constraints_round_trip(client: TestClient, translator: Translator, sentences: list[str]) -> None:
    texts = sentences[:3]
    words = [t.split()[0] for t in texts]
    constraints = [[words[0]], None, [words[2], words[1]]]
    exclude = [None, [words[0]], None]
    r = client.post("/v1/translate", json={"texts": texts, "beam": 2, "constraints": constraints,
                                           "exclude": exclude})
    assert r.status_code == 200, r.text
    expected = translator.translate(texts, beam=2, constraints=[
        {"include": c or [], "exclude": e or []} for c, e in zip(constraints, exclude)])
    assert r.json()["translations"] == expected
    for phrase in constraints[0]:
        assert phrase in expected[0]


def test_bad_constraint_requests(client: TestClient, sentences: list[str]) -> None:
    r = client.post("/v1/translate", json={"texts": ["a", "b"], "constraints": [["x"]]})
    assert (r.status_code, r.json()["error"]) == (422, "invalid_request")
    assert r.json()["message"] == "constraints: 1 entries for 2 texts; give one per text (null for none)"
    r = client.post("/v1/translate", json={"texts": ["a"], "constraints": "x"})
    assert r.status_code == 422
    long = " ".join([sentences[0].split()[0]] * 40)
    r = client.post("/v1/translate", json={"texts": ["a"], "constraints": [[long]], "max_len_b": 2})
    assert (r.status_code, r.json()["error"]) == (422, "invalid_request")
    assert r.json()["message"].startswith("texts[0]: the constraints need ")
    r = client.post("/v1/translate", json={"texts": ["a"], "constraints": [[long]], "max_len_b": 2,
                                           "constraints_best_effort": True})
    assert r.status_code == 200
