"""Request and response bodies of the HTTP API (pydantic models; FastAPI turns them into
the OpenAPI schema at ``/docs``).

Requests are strict: ``"beam": "4"`` or ``"texts": "a sentence"`` are type errors rather
than silently coerced, and unknown fields are errors (a typo such as ``"nbets"`` must not
be ignored). Limits that depend on the server's settings (number of texts, characters per
text) are checked in :mod:`aiayn.serving.app`, not here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class TranslateRequest(BaseModel):
    """``POST /v1/translate``. Decoding fields left out take the checkpoint's defaults."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "examples": [{"texts": ["a small example sentence"], "beam": 4, "nbest": 1, "attention": False}],
    })

    texts: list[str] = Field(..., min_length=1, description="sentences to translate, in order")
    beam: int | None = Field(None, ge=1, le=64, description="beam size (1 = greedy)")
    nbest: int = Field(1, ge=1, le=64, description="hypotheses returned per sentence (<= beam)")
    attention: bool = Field(False, description="return per-layer, per-head cross-attention of the best hypothesis")
    lenpen: float | None = Field(None, ge=0.0, le=10.0, description="length-penalty alpha (0.6 in the paper)")
    max_len_a: float | None = Field(None, ge=0.0, le=10.0, description="max output length = a * source length + b")
    max_len_b: int | None = Field(None, ge=0, le=1024)
    min_len: int | None = Field(None, ge=0, le=1024)
    no_repeat_ngram_size: int | None = Field(None, ge=0, le=16)

    def decode_overrides(self) -> dict[str, Any]:
        """The DecodeConfig fields this request sets (None = checkpoint default)."""
        names = ("beam", "lenpen", "max_len_a", "max_len_b", "min_len", "no_repeat_ngram_size")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


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
