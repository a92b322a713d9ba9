"""The request body of POST /v1/translate is generated from DecodeConfig's HTTP fields."""

from __future__ import annotations

import typing

import pytest

pytest.importorskip("pydantic")

from pydantic import ValidationError  # noqa: E402

from aiayn.config import DecodeConfig, decode_options  # noqa: E402
from aiayn.serving.schemas import TranslateRequest  # noqa: E402

REQUEST_ONLY = {"texts", "attention", "constraints", "exclude", "constraints_best_effort"}


def test_request_fields_are_the_decode_fields_marked_for_http() -> None:
    marked = {f.name for f, opt in decode_options() if opt.http is not None}
    assert set(TranslateRequest.model_fields) - REQUEST_ONLY == marked
    # The published order (OpenAPI, and the "known fields" of an unknown_field error).
    assert list(TranslateRequest.model_fields) == ["texts", "beam", "nbest", "attention", "lenpen", "max_len_a",
                                                   "max_len_b", "min_len", "no_repeat_ngram_size", "tgt_lang",
                                                   "shortlist", "constraints", "exclude",
                                                   "constraints_best_effort"]


def test_request_schema_carries_the_metadata() -> None:
    hints = typing.get_type_hints(DecodeConfig)
    props = TranslateRequest.model_json_schema()["properties"]
    for f, opt in decode_options():
        if opt.http is None:
            continue
        prop = props[f.name]
        assert prop.get("description") == opt.http.description, f.name
        if opt.argument:  # nbest: the field's default, never null
            assert prop["default"] == f.default and "anyOf" not in prop
            bounded = prop
        else:  # left out = null = the checkpoint's value
            assert prop.get("default") is None and prop["anyOf"][1] == {"type": "null"}
            bounded = prop["anyOf"][0]
        if hints[f.name] in (str, bool):  # tgt_lang (checked by DecodeConfig.validate), shortlist
            assert bounded["type"] == {str: "string", bool: "boolean"}[hints[f.name]], f.name
            assert "minimum" not in bounded, f.name
            continue
        assert (bounded["minimum"], bounded["maximum"]) == (opt.http.ge, opt.http.le), f.name
        assert bounded["type"] == {int: "integer", float: "number"}[hints[f.name]], f.name


def test_request_is_strict_and_gives_overrides() -> None:
    req = TranslateRequest(texts=["a"], beam=2, nbest=2, lenpen=0.0)
    assert req.decode_overrides() == {"beam": 2, "lenpen": 0.0}  # nbest travels on its own
    assert TranslateRequest(texts=["a"]).decode_overrides() == {}
    for bad in ({"texts": ["a"], "beam": "4"}, {"texts": "a"}, {"texts": ["a"], "nbets": 2},
                {"texts": ["a"], "beam": 65}, {"texts": ["a"], "sampling": True}, {"texts": []}):
        with pytest.raises(ValidationError):
            TranslateRequest.model_validate(bad)
