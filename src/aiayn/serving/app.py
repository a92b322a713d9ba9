"""The HTTP translation service: FastAPI app around one translator (anything that is a
:class:`~aiayn.inference.protocol.TranslatorProtocol`: a PyTorch checkpoint or a
CTranslate2 export).

Endpoints: ``POST /v1/translate``, ``GET /v1/model``, ``GET /health``, ``GET /metrics``
(Prometheus text), ``GET /`` (the attention page, from ``static/``) and FastAPI's
``/docs`` + ``/openapi.json``. With ``ServeSettings.api_key`` every path but ``/health``,
the page and the documentation needs the key (:mod:`aiayn.serving.auth`); with
``ServeSettings.cors_origins`` browsers on those origins may call the API.

Every error is JSON ``{"error": CODE, "message": TEXT}`` with a 4xx/5xx status:

=====  ======================  ====================================================
400    ``malformed_json``      the body is not valid JSON
401    ``unauthorized``        no API key, or a wrong one (with ``WWW-Authenticate``)
413    ``body_too_large``      the body is over ``max_body_bytes``
415    ``unsupported_media``   the body is not ``application/json``
422    ``invalid_request``     a field has the wrong type or value (``details`` list)
422    ``unknown_field``       a field the API does not know (typos are not ignored)
422    ``too_many_texts``      more than ``max_texts`` texts in one request
422    ``text_too_long``       a text over ``max_chars`` characters, or over the model's
                               source positions once tokenized
408    ``request_timeout``     headers or body too slow (:mod:`aiayn.serving.connections`)
503    ``overloaded``          the queue is full (with ``Retry-After``)
503    ``too_many_connections`` ``--max-connections`` open, all busy (with ``Retry-After``)
503    ``shutting_down``       the server is stopping
500    ``translation_failed``  the model raised on this request (logged with its traceback;
                               the other requests of its batch are retried and unaffected)
500    ``internal_error``      any other bug; logged, never shown
=====  ======================  ====================================================
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.params import Depends
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import APIKeyHeader, HTTPBearer
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from aiayn.config import DecodeConfig
from aiayn.errors import AiaynError
from aiayn.inference.protocol import TranslatorProtocol
from aiayn.inference.request import SourceTooLong, TranslationRequest
from aiayn.inference.results import Hypothesis, TranslationResult
from aiayn.inference.terms import SentenceConstraints
from aiayn.serving.auth import APIKeyMiddleware, check_api_key, check_cors_origin
from aiayn.serving.batcher import BatchLimits, DecodeOptions, DynamicBatcher, QueueFullError, ShuttingDownError
from aiayn.serving.metrics import CONTENT_TYPE, ServerMetrics
from aiayn.serving.schemas import ErrorBody, RequestBase, TranslateRequest, TranslateResponse

# The key of a request's terminology among its batching options: (per text, the JSON of its
# {"include", "exclude"}; best effort).
LEXICAL_KEY = "lexical"

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"

# Paths that get their own label in the metrics; anything else counts as "other" so that
# scanners probing random URLs cannot blow up the number of time series.
_KNOWN_PATHS = ("/", "/health", "/metrics", "/v1/model", "/v1/translate", "/docs", "/openapi.json")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass
class ServeSettings:
    """Limits and batching knobs (``aiayn serve --help`` documents each)."""

    max_texts: int = 64
    max_chars: int = 2000
    max_body_bytes: int = 1_000_000
    # Cross-attention weights one request may ask for (layers x heads x output x source
    # tokens, summed over its texts, at the longest output the decoding options allow).
    max_attention_values: int = 1_000_000
    queue_size: int = 256
    batch_window_ms: float = 5.0
    max_batch_tokens: int = 4096
    max_batch_sentences: int = 64
    batching: bool = True
    retry_after_s: int = 1
    checkpoint: str | None = None
    device: str = "cpu"
    dtype: str | None = None  # None: the translator's own (``Translator.dtype``: "auto" as resolved)
    # None: no authentication. Kept out of repr() so that it is not logged by accident.
    api_key: str | None = field(default=None, repr=False)
    # Origins (scheme://host[:port], or "*") whose pages may call the API; empty: no CORS headers.
    cors_origins: tuple[str, ...] = ()


class APIError(Exception):
    """An error answered as JSON: status, machine code, message."""

    def __init__(self, status: int, code: str, message: str, details: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.details, self.headers = details, headers


class ClientGone(APIError):
    """The client disconnected while its request waited in the queue: it was dropped
    untranslated. Answered (to nobody) with nginx's 499 and counted like any error."""

    def __init__(self) -> None:
        super().__init__(499, "client_closed_request", "the client disconnected before its request was translated")


async def until_disconnected(request: Request) -> None:
    """Return once the client of ``request`` (whose body has been read) has disconnected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ---------------------------------------------------------------------- helpers


def _jsonable_details(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # pydantic's error dicts may carry exceptions in "ctx" and bytes in "input".
    out = []
    for e in errors:
        out.append({"loc": [str(x) for x in e.get("loc", ())], "type": str(e.get("type", "")),
                    "msg": str(e.get("msg", ""))})
    return out


def _where(loc: Sequence[Any]) -> str:
    parts = [str(x) for x in loc if x != "body"]
    text = ""
    for p in parts:
        text += f"[{p}]" if p.isdigit() else (f".{p}" if text else p)
    return text or "body"


def _to_nested(x: Any) -> list:
    """A tensor / array / nested list of attention weights as nested lists of rounded floats."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu()
    if hasattr(x, "tolist"):
        x = x.tolist()
    return _round(x)


def _round(x: Any) -> Any:
    # 4 decimals are plenty for a heatmap and shrink the JSON about 3x.
    if isinstance(x, list):
        return [_round(v) for v in x]
    v = float(x)
    return round(v, 4) if math.isfinite(v) else 0.0


def _labels(pieces: list[str] | None, n: int, tail: str) -> list[str]:
    """``n`` axis labels from ``pieces``: the attention may have one row more than the
    pieces (the EOS step, see aiayn.inference.search), so the missing ones are ``tail``."""
    pieces = list(pieces or [])
    if len(pieces) >= n:
        return pieces[:n]
    return pieces + [tail] * (n - len(pieces))


def _shape(nested: Any) -> tuple[int, ...]:
    shape = []
    while isinstance(nested, list):
        shape.append(len(nested))
        nested = nested[0] if nested else None
    return tuple(shape)


def _best_target_tokens(result: TranslationResult) -> int:
    return len(result.hypotheses[0].tokens) if result.hypotheses else 0


# ---------------------------------------------------------------------- middleware


AMBIGUOUS_FRAMING = ("the request has both Content-Length and Transfer-Encoding (RFC 9112 section 6.3: a "
                     "sign of request smuggling); send one of them. The connection is closed")


def _ambiguous_framing(scope: Scope) -> bool:
    """Whether the request's headers give its body two lengths (Content-Length and
    Transfer-Encoding): refused, and the connection closed, as RFC 9112 section 6.3 asks."""
    names = {name.lower() for name, _ in scope.get("headers") or []}
    return b"content-length" in names and b"transfer-encoding" in names


class BodyLimitMiddleware:
    """Refuse bodies over ``limit`` bytes with 413 before any of it is parsed.

    Checks Content-Length up front and also counts the bytes actually received, so a
    chunked body without a length cannot slip past the limit.
    """

    def __init__(self, app: ASGIApp, limit: int, metrics: ServerMetrics) -> None:
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _ambiguous_framing(scope):
            await self._reject(APIError(400, "ambiguous_framing", AMBIGUOUS_FRAMING), scope, receive, send)
            return
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_large = APIError(413, "body_too_large", f"request body is over the limit of {self.limit} bytes")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._reject(too_large, scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._reject(too_large, scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = json_body_problem(headers.get(b"content-type"), body) if scope["path"] in JSON_PATHS else None
        if problem is not None:
            await self._reject(problem, scope, receive, send, close=False)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, err: APIError, scope: Scope, receive: Receive, send: Send, close: bool = True) -> None:
        response = error_response(err, self.metrics)
        if close:  # the rest of the body was not read: the client must not reuse the connection
            response.headers["connection"] = "close"
        await response(scope, receive, send)


# Endpoints whose body is JSON, checked before FastAPI parses it.
JSON_PATHS = frozenset({"/v1/translate"})


def json_body_problem(content_type: bytes | None, body: bytes) -> APIError | None:
    """What is wrong with a JSON request body, or None: FastAPI would answer these with a
    422, a 400 ``http_400`` or, for a lone UTF-16 surrogate (valid JSON, but no text), a 500."""
    ctype = (content_type or b"").decode("latin-1").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        return APIError(415, "unsupported_media",
                        f"expected Content-Type application/json, got {ctype or 'none'}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return APIError(400, "malformed_json", f"request body is not valid UTF-8 (byte {exc.start})")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        return APIError(400, "malformed_json", f"request body is not valid JSON: {exc.msg} at byte {exc.pos}")
    except RecursionError:
        return APIError(400, "malformed_json", "request body is not valid JSON: nested too deeply")
    try:
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return APIError(400, "malformed_json", "request body has a string with an unpaired UTF-16 surrogate "
                                               f"({exc.object[exc.start:exc.end]!a}); send valid Unicode text")
    return None


class MetricsMiddleware:
    """Count requests by path and status, and time them."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        label = path if path in _KNOWN_PATHS else ("/static" if path.startswith("/static/") else "other")
        status = 500
        start = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.requests.labels(code=str(status), path=label).inc()
            self.metrics.latency.labels(path=label).observe(time.perf_counter() - start)


def error_response(err: APIError, metrics: ServerMetrics | None = None) -> JSONResponse:
    if metrics is not None:
        metrics.errors.labels(code=err.code, status=str(err.status)).inc()
    body: dict[str, Any] = {"error": err.code, "message": err.message}
    if err.details:
        body["details"] = err.details
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def validation_error(request: Request, exc: RequestValidationError) -> APIError:
    """The API's error for a body FastAPI could not validate against :data:`TranslateRequest`."""
    errors = list(exc.errors())
    types = {str(e.get("type")) for e in errors}
    ctype = request.headers.get("content-type", "")
    if ctype and "json" not in ctype.lower():
        # FastAPI does not parse a non-JSON body, so its errors would only confuse.
        return APIError(415, "unsupported_media", f"expected Content-Type application/json, got {ctype}")
    if "json_invalid" in types:
        e = next(e for e in errors if e.get("type") == "json_invalid")
        ctx = e.get("ctx") or {}
        return APIError(400, "malformed_json", f"request body is not valid JSON: {ctx.get('error', e.get('msg'))}")
    if "extra_forbidden" in types:
        names = [_where(e["loc"]) for e in errors if e.get("type") == "extra_forbidden"]
        known = ", ".join(TranslateRequest.model_fields)
        return APIError(422, "unknown_field", f"unknown field(s): {', '.join(names)}; known fields: {known}",
                        _jsonable_details(errors))
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return APIError(422, "invalid_request", f"{_where(first.get('loc', ()))}: {first.get('msg')}{more}",
                    _jsonable_details(errors))


# ---------------------------------------------------------------------- the app


class TranslationService:
    """The model side of the app: limits, batching, turning results into JSON."""

    def __init__(self, translator: TranslatorProtocol, settings: ServeSettings, metrics: ServerMetrics) -> None:
        self.translator = translator
        self.settings = settings
        self.metrics = metrics
        self.max_positions = translator.max_src_len
        limits = BatchLimits(settings.max_batch_tokens, settings.max_batch_sentences, settings.batch_window_ms,
                             settings.queue_size)
        self.batcher = DynamicBatcher(self._translate, metrics=metrics, limits=limits, enabled=settings.batching,
                                      target_tokens=_best_target_tokens)
        self.closing = False

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Run the batcher's worker while the app serves."""
        s = self.settings
        self.batcher.start()
        log.info("serving: batching %s (window %.1f ms, %d tokens, queue %d)",
                 "on" if s.batching else "off", s.batch_window_ms, s.max_batch_tokens, s.queue_size)
        yield
        # uvicorn calls this after in-flight requests have finished (graceful shutdown);
        # close() still drains whatever is queued before the worker stops.
        self.closing = True
        await asyncio.to_thread(self.batcher.close)

    def _translate(self, items: list[tuple[str, list[Any]]], nbest: int, attention: bool,
                   overrides: dict[str, Any]) -> list[TranslationResult]:
        """``items``: (text, its source tokens as check_limits encoded them). Runs on the batcher's
        worker thread: the only thread that touches the model."""
        texts, sources = [t for t, _ in items], [s for _, s in items]
        overrides = dict(overrides)
        lexical = overrides.pop(LEXICAL_KEY, None)
        constraints, best_effort = None, False
        if lexical is not None:
            # Requests share a batch only with equal options, so every request of this batch
            # has these constraints, one per text: text i takes entry i modulo their number.
            per_text, best_effort = lexical
            constraints = [per_text[i % len(per_text)] for i in range(len(texts))]
        decode = self.translator.decode_config(**{**overrides, "nbest": nbest})
        return self.translator.run(TranslationRequest(texts, decode, attention, constraints=constraints,
                                                      best_effort=best_effort, truncate=False, sources=sources))

    def check_limits(self, req: RequestBase) -> list[list[Any]]:
        """The request's sources, encoded once (the worker translates them as they are), after
        every limit is checked."""
        s = self.settings
        if len(req.texts) > s.max_texts:
            raise APIError(422, "too_many_texts",
                           f"texts: {len(req.texts)} texts in one request; the limit is {s.max_texts}")
        for i, text in enumerate(req.texts):
            if len(text) > s.max_chars:
                raise APIError(422, "text_too_long",
                               f"texts[{i}]: {len(text)} characters; the limit is {s.max_chars}")
        try:
            decode = self.translator.decode_config(**req.decode_overrides())
        except AiaynError as exc:
            raise APIError(422, "invalid_request", str(exc)) from None
        sources = self.translator.encode_sources(req.texts, decode)
        lengths = [len(ids) for ids in sources]
        if self.max_positions is not None:
            for i, n in enumerate(lengths):
                if n > self.max_positions:  # the request's one rule, untruncated
                    raise APIError(422, "text_too_long", str(SourceTooLong(i, n, self.max_positions)))
        beam = req.decode_overrides().get("beam")
        if beam is None and self.translator.config is not None:
            beam = self.translator.config.decode.beam
        if beam is not None and req.nbest > beam:
            raise APIError(422, "invalid_request", f"nbest: {req.nbest} is more than beam={beam}")
        if req.attention:
            self._check_attention_size(decode, lengths)
        return sources

    def _check_attention_size(self, decode: DecodeConfig, lengths: list[int]) -> None:
        """Refuse, before any decoding, a request whose attention could outgrow the limit
        (``decode``: its options): a small request asking for long outputs' attention would
        otherwise cost the server (and the client) hundreds of megabytes."""
        cfg = self.translator.config
        if cfg is None:
            return
        per_position = cfg.model.n_decoder_layers * cfg.model.n_heads
        longest = self.max_positions or 1 << 30
        bound = sum(per_position * min(decode.max_output_len(n) + 1, longest) * n
                    for n in lengths)
        limit = self.settings.max_attention_values
        if bound > limit:
            raise APIError(413, "attention_too_large",
                           f"attention: this request may return up to {bound:,} weights (layers x heads x output "
                           f"x source tokens); the limit is {limit:,} (--max-attention-values): send fewer or "
                           "shorter texts, a smaller max_len_b, or no attention")

    async def translate(self, req: RequestBase,
                        disconnected: Callable[[], Awaitable[Any]] | None = None) -> dict[str, Any]:
        """``req`` translated. ``disconnected``: completes when the client has gone; a request
        still queued then is dropped from the queue (:meth:`DynamicBatcher.withdraw`)."""
        if self.closing:
            raise APIError(503, "shutting_down", "the server is shutting down")
        sources = self.check_limits(req)
        overrides = req.decode_overrides()
        try:
            lexical = req.lexical_constraints()
            if lexical is not None:  # hashable values, so that the options can be compared and grouped
                overrides[LEXICAL_KEY] = (tuple(SentenceConstraints.coerce(c, f"constraints[{i}]")
                                                for i, c in enumerate(lexical)), req.constraints_best_effort)
        except ValueError as exc:
            raise APIError(422, "invalid_request", str(exc)) from None
        options = DecodeOptions.make(req.nbest, req.attention, overrides)
        try:
            future = self.batcher.submit(list(zip(req.texts, sources)), [len(ids) for ids in sources], options)
        except QueueFullError as exc:
            raise APIError(503, "overloaded", f"server busy: {exc}; retry later",
                           headers={"Retry-After": str(self.settings.retry_after_s)}) from None
        except ShuttingDownError:
            raise APIError(503, "shutting_down", "the server is shutting down") from None
        try:
            results = await self._result(future, disconnected)
        except ShuttingDownError:
            raise APIError(503, "shutting_down", "the server is shutting down") from None
        except AiaynError as exc:  # a user-caused problem the translator reports (e.g. a bad option)
            raise APIError(422, "invalid_request", str(exc)) from None
        except ClientGone:
            log.debug("request dropped from the queue: its client disconnected")
            raise
        except Exception:
            # Answered here rather than by the app-wide handler: Starlette re-raises from
            # there and uvicorn then drops the client's keep-alive connection.
            log.exception("translation failed (%d texts)", len(req.texts))
            raise APIError(500, "translation_failed", "the model failed on this request (see the server log)") from None
        if req.attention:
            # Converting L x H x T x S weights to JSON lists is real work: keep it off the loop.
            return await asyncio.to_thread(self.render, results, req)
        return self.render(results, req)

    async def _result(self, future: concurrent.futures.Future, disconnected: Callable[[], Awaitable[Any]] | None
                      ) -> Any:
        """The batcher's result; a client that disconnects while its request is queued takes
        it out of the queue (:class:`ClientGone`)."""
        waiting = asyncio.wrap_future(future)
        if disconnected is None:
            return await waiting
        watcher = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({waiting, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not waiting.done() and self.batcher.withdraw(future):
            waiting.cancel()
            raise ClientGone()
        return await waiting

    def render(self, results: list[TranslationResult], req: RequestBase) -> dict[str, Any]:
        translations, scores = [], []
        nbest: list[list[dict[str, Any]]] = []
        attention: list[dict[str, Any]] = []
        for result in results:
            hyps = list(result.hypotheses)
            best = hyps[0] if hyps else None
            translations.append(best.text if best is not None else "")
            scores.append(float(best.score) if best is not None else float("-inf"))
            nbest.append([{"text": h.text, "score": float(h.score)} for h in hyps[:req.nbest]])
            if req.attention:
                attention.append(self._attention(best))
        body: dict[str, Any] = {"translations": translations,
                                "scores": [s if math.isfinite(s) else -1e9 for s in scores]}
        if req.nbest > 1:
            body["nbest"] = nbest
        if req.attention:
            body["attention"] = attention
        return body

    @staticmethod
    def _attention(hyp: Hypothesis | None) -> dict[str, Any]:
        raw = hyp.attention if hyp is not None else None
        src = list(hyp.src_pieces) if hyp is not None else []
        tgt = list(hyp.tgt_pieces) if hyp is not None else []
        if raw is None:
            return {"src_tokens": src, "tgt_tokens": tgt, "layers": 0, "heads": 0, "weights": []}
        weights = _to_nested(raw)
        shape = _shape(weights)
        if len(shape) != 4:
            raise RuntimeError(f"attention has shape {shape}, expected (layers, heads, target, source)")
        n_layers, n_heads, n_tgt, n_src = shape
        return {"src_tokens": _labels(src, n_src, "</s>"), "tgt_tokens": _labels(tgt, n_tgt, "</s>"),
                "layers": n_layers, "heads": n_heads, "weights": weights}

    def model_info(self) -> dict[str, Any]:
        s = self.settings
        return {
            **self.translator.describe(),
            "checkpoint": s.checkpoint, "device": s.device, "dtype": s.dtype or getattr(self.translator, "dtype", None),
            "limits": {"max_texts": s.max_texts, "max_chars": s.max_chars, "max_body_bytes": s.max_body_bytes,
                       "max_positions": self.max_positions},
            "batching": {"enabled": s.batching, "window_ms": s.batch_window_ms,
                         "max_batch_tokens": s.max_batch_tokens, "max_batch_sentences": s.max_batch_sentences,
                         "queue_size": s.queue_size},
        }


def create_app(translator: TranslatorProtocol, settings: ServeSettings | None = None) -> FastAPI:
    """The FastAPI app serving ``translator``."""
    settings = settings or ServeSettings()
    metrics = ServerMetrics()
    service = TranslationService(translator, settings, metrics)
    app = FastAPI(
        title="aiayn translation service",
        description="The Transformer of 'Attention Is All You Need': translation with n-best and "
                    "cross-attention. Errors are JSON `{error, message}`.",
        version=_version(), lifespan=service.lifespan,
        responses={422: {"model": ErrorBody, "description": "invalid request"},
                   400: {"model": ErrorBody, "description": "malformed JSON"}},
    )
    app.state.service = service
    app.state.metrics = metrics
    app.state.settings = settings
    add_exception_handlers(app, metrics)
    add_routes(app, service, metrics, protected=settings.api_key is not None)
    add_middleware(app, settings, metrics)
    return app


def add_middleware(app: FastAPI, settings: ServeSettings, metrics: ServerMetrics) -> None:
    """In a request's path, outermost first: metrics (they see everything, 401s and 413s
    included); CORS (it answers browsers' preflight requests, which never carry a key, and
    adds its headers to every answer, 401s included, so that a page can read them); the API
    key (checked before any of the body is read); the body limit."""
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes, metrics=metrics)
    if settings.api_key is not None:
        app.add_middleware(APIKeyMiddleware, key=check_api_key(settings.api_key, "ServeSettings.api_key"),
                           open_paths=open_paths(app), metrics=metrics)
    if settings.cors_origins:
        origins = [check_cors_origin(o, "ServeSettings.cors_origins") for o in settings.cors_origins]
        # No allow_credentials: the key travels in a header the page sets, not in a cookie.
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "HEAD", "POST"],
                           allow_headers=["Authorization", "Content-Type", "X-API-Key"],
                           expose_headers=["Retry-After"])
    app.add_middleware(MetricsMiddleware, metrics=metrics)


def open_paths(app: FastAPI) -> set[str]:
    """The paths served without the API key (besides ``/static/``): the health check, and
    the page and documentation, which are the same for everyone."""
    paths = {"/", "/health", app.docs_url, app.redoc_url, app.openapi_url, app.swagger_ui_oauth2_redirect_url}
    return {p for p in paths if p}


def add_exception_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every error, expected or not, answered as JSON ``{error, message}`` and counted."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc, metrics)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(request, exc), metrics)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        err = APIError(exc.status_code, codes.get(exc.status_code, f"http_{exc.status_code}"), str(exc.detail),
                       headers=getattr(exc, "headers", None))
        return error_response(err, metrics)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(APIError(500, "internal_error", "internal server error (see the server log)"),
                              metrics)


def _key_schemes(protected: bool) -> dict[str, Any]:
    """Route arguments declaring the API key in the OpenAPI schema, so that /docs offers an
    Authorize button. The key is checked by :class:`APIKeyMiddleware`; these dependencies
    only describe it (``auto_error=False``: they never refuse anything)."""
    if not protected:
        return {}
    schemes: list[Depends] = [
        Security(HTTPBearer(auto_error=False, description="Authorization: Bearer KEY")),
        Security(APIKeyHeader(name="X-API-Key", auto_error=False, description="or X-API-Key: KEY"))]
    return {"dependencies": schemes,
            "responses": {401: {"model": ErrorBody, "description": "no API key, or a wrong one"}}}


def add_routes(app: FastAPI, service: TranslationService, metrics: ServerMetrics, protected: bool = False) -> None:
    """The endpoints, the attention page and its static files (``protected``: the API key
    is required, and declared in the OpenAPI schema)."""
    key = _key_schemes(protected)

    @app.post("/v1/translate", response_model=TranslateResponse, response_model_exclude_none=True,
              summary="Translate texts", tags=["translation"], **key)
    async def translate(req: TranslateRequest, request: Request) -> dict[str, Any]:  # type: ignore[valid-type]
        return await service.translate(req, disconnected=lambda: until_disconnected(request))

    @app.get("/v1/model", summary="Model configuration, languages, vocabulary, parameters", tags=["model"], **key)
    async def model_info() -> dict[str, Any]:
        return service.model_info()

    # HEAD is left out of the schema: one route with both methods gives OpenAPI two
    # operations with the same id.
    @app.head("/health", include_in_schema=False)
    @app.get("/health", summary="Liveness (GET or HEAD)", tags=["ops"])
    async def health() -> JSONResponse:
        if service.closing:
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok", "queue": service.batcher.depth})

    @app.get("/metrics", summary="Prometheus metrics", tags=["ops"], response_class=PlainTextResponse, **key)
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("aiayn")
    except Exception:  # noqa: BLE001 - not installed (running from a source tree)
        return "0"
