"""Request and response bodies of the HTTP API (pydantic models; FastAPI turns them into
the OpenAPI schema at ``/docs``).

Requests are strict: ``"beam": "4"`` or ``"texts": "a sentence"`` are type errors rather
than silently coerced, and unknown fields are errors (a typo such as ``"nbets"`` must not
be ignored). Limits that depend on the server's settings (number of texts, characters per
text) are checked in :mod:`aiayn.serving.app`, not here.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from aiayn.config import DecodeConfig, decode_options

# The DecodeConfig fields a request may set: those with an HttpField.
HTTP_OPTIONS = [(f, opt) for f, opt in decode_options() if opt.http is not None]
# Per-call arguments (nbest) travel beside the overrides, not among them.
HTTP_OVERRIDES = tuple(f.name for f, opt in HTTP_OPTIONS if not opt.argument)


class RequestBase(BaseModel):
    """What every ``POST /v1/translate`` body has; :data:`TranslateRequest` adds the
    decoding fields generated from :class:`~aiayn.config.DecodeConfig`."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "examples": [{"texts": ["a small example sentence"], "beam": 4, "nbest": 1, "attention": False}],
    })

    if typing.TYPE_CHECKING:  # declared for type checkers; the fields come in their published order below
        texts: list[str]
        nbest: int
        attention: bool

    if typing.TYPE_CHECKING:
        constraints: list[list[str] | None] | None
        exclude: list[list[str] | None] | None
        constraints_best_effort: bool

    def lexical_constraints(self) -> list[dict[str, list[str]]] | None:
        """Per text ``{"include", "exclude"}`` (as the translator takes them), or None when the
        request has no terminology. A list whose length is not that of ``texts`` is a
        ValueError naming the field."""
        if self.constraints is None and self.exclude is None:
            return None
        for name in ("constraints", "exclude"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.texts):
                raise ValueError(f"{name}: {len(given)} entries for {len(self.texts)} texts; give one per text "
                                 "(null for none)")
        n = len(self.texts)
        include = self.constraints or [None] * n
        exclude = self.exclude or [None] * n
        return [{"include": list(i or []), "exclude": list(e or [])} for i, e in zip(include, exclude)]

    def decode_overrides(self) -> dict[str, Any]:
        """The DecodeConfig fields this request sets (None = checkpoint default)."""
        return {n: getattr(self, n) for n in HTTP_OVERRIDES if getattr(self, n) is not None}


# Terminology, per text (request-only, after every decoding field).
LEXICAL_FIELDS: list[tuple[int, str, Any]] = [
    (1000, "constraints", (list[list[str] | None] | None, Field(
        None, description="per text (null for none), phrases that must appear in its translation"))),
    (1001, "exclude", (list[list[str] | None] | None, Field(
        None, description="per text (null for none), phrases that must not appear in its translation"))),
    (1002, "constraints_best_effort", (bool, Field(
        False, description="translate a text whose constraints cannot be met without them, instead of "
                           "refusing the request"))),
]


def _request_fields() -> dict[str, Any]:
    """(annotation, Field) per request field, in the published order."""
    hints = typing.get_type_hints(DecodeConfig)
    # The request-only fields, at their positions among the HttpField ones (see HttpField).
    placed: list[tuple[int, str, Any]] = [
        (0, "texts", (list[str], Field(..., min_length=1, description="sentences to translate, in order"))),
        (3, "attention", (bool, Field(False, description="return per-layer, per-head cross-attention of the "
                                                         "best hypothesis"))),
        *LEXICAL_FIELDS,
    ]
    for f, opt in HTTP_OPTIONS:
        http = opt.http
        assert http is not None
        # A left-out override is None (the checkpoint's value); an argument has its own default.
        annotation, default = (hints[f.name], f.default) if opt.argument else (hints[f.name] | None, None)
        placed.append((http.position, f.name,
                       (annotation, Field(default, ge=http.ge, le=http.le, description=http.description))))
    return {name: spec for _, name, spec in sorted(placed, key=lambda item: item[0])}


TranslateRequest = create_model(
    "TranslateRequest", __base__=RequestBase, __module__=__name__,
    __doc__="``POST /v1/translate``. Decoding fields left out take the checkpoint's defaults.",
    **_request_fields())


class Candidate(BaseModel):
    text: str
    score: float = Field(..., description="the search's (length-normalized) log-probability score")


class Attention(BaseModel):
    """Cross-attention of one translation: ``weights[layer][head][target][source]``."""

    src_tokens: list[str]
    tgt_tokens: list[str]
    layers: int
    heads: int
    weights: list[list[list[list[float]]]]


class TranslateResponse(BaseModel):
    translations: list[str] = Field(..., description="best translation of each input text, in input order")
    scores: list[float] = Field(..., description="score of each best translation")
    nbest: list[list[Candidate]] | None = Field(None, description="present when nbest > 1")
    attention: list[Attention] | None = Field(None, description="present when attention is true")


class ErrorBody(BaseModel):
    """Every error the API returns: a machine-readable ``error`` code and a message for people."""

    error: str = Field(..., examples=["too_many_texts"])
    message: str = Field(..., examples=["texts: 300 texts in one request; the limit is 64"])
    details: list[dict[str, Any]] | None = None
