"""Who may call the server: the API key of `aiayn serve --api-key`, and the checks of
the ``--api-key`` and ``--cors-origin`` values.

A request must carry the key as ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``,
except to the open paths: ``/health`` (for load balancers and orchestrators), and the
attention page, its static files and the API documentation, which are the same for
everyone and reveal nothing about the model; the page asks for the key and sends it with
its API calls. Anything else, unknown paths included (so that a client without the key
cannot probe which paths exist), is answered ``401`` with a JSON body and
``WWW-Authenticate: Bearer``, before any of the request's body is read.

Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`: constant time in
the content, and hashing first means the time does not depend on the key's length either.
"""

from __future__ import annotations

import hashlib
import hmac
import urllib.parse
from collections.abc import Awaitable, Callable, Collection, Iterable, MutableMapping
from typing import Any

from fastapi.responses import JSONResponse

from aiayn.errors import ConfigError
from aiayn.serving.metrics import ServerMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ENV_VAR = "AIAYN_API_KEY"
REALM = 'Bearer realm="aiayn"'
# Paths under these prefixes are open too (the page's scripts and stylesheet).
OPEN_PREFIXES = ("/static/",)


def check_api_key(key: str, name: str = "--api-key") -> str:
    """``key`` if it can be sent in an HTTP header as it is; else a :class:`ConfigError`
    naming ``name`` (the flag or variable it came from)."""
    if not key:
        raise ConfigError(f"{name}: the API key is empty; give a key, or leave {name} unset to serve without one")
    if not all("!" <= c <= "~" for c in key):
        # HTTP strips surrounding spaces from header values, and a non-ASCII key may not survive
        # a client's header encoding: such a key could never match.
        raise ConfigError(f"{name}: the API key must be printable ASCII without spaces (it is sent in an "
                          "HTTP header)")
    return key


def check_cors_origin(origin: str, name: str = "--cors-origin") -> str:
    """``origin`` as browsers send it (``scheme://host[:port]``, lower case), or ``*``; a
    value that no browser would send, such as one with a path, is a :class:`ConfigError`
    rather than an origin that silently never matches."""
    if origin == "*":
        return origin
    problem = "not an origin"
    try:
        parts = urllib.parse.urlsplit(origin)
        _ = parts.port  # raises on a port that is not a number
    except ValueError:
        parts = None
    if parts is not None and parts.scheme and parts.hostname:
        if parts.path or parts.query or parts.fragment or parts.username is not None:
            problem = "an origin has no path, query or user (not even a trailing /)"
        else:
            return f"{parts.scheme}://{parts.netloc}".lower()
    raise ConfigError(f"{name}: {origin!r}: {problem}; expected scheme://host[:port], e.g. https://example.com, "
                      "or * for any origin")


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def _has_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        name = name.lower()
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() not in (b"", b"0")):
            return True
    return False


def presented_keys(headers: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """The keys a request presents: the token of ``Authorization: Bearer`` (the scheme is
    case-insensitive, RFC 7235) and the value of ``X-API-Key``."""
    keys = []
    for name, value in headers:
        name = name.lower()
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                keys.append(token.strip())
        elif name == b"x-api-key" and value.strip():
            keys.append(value.strip())
    return keys


class APIKeyMiddleware:
    """Answer 401 to requests for a protected path without the right key."""

    def __init__(self, app: ASGIApp, key: str, open_paths: Collection[str],
                 metrics: ServerMetrics | None = None) -> None:
        self.app, self.metrics = app, metrics
        self.open_paths = frozenset(open_paths)
        self._key_digest = _digest(key.encode("ascii"))

    def is_open(self, path: str) -> bool:
        return path in self.open_paths or path.startswith(OPEN_PREFIXES)

    def accepts(self, candidate: bytes) -> bool:
        return hmac.compare_digest(_digest(candidate), self._key_digest)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.is_open(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        keys = presented_keys(scope.get("headers") or [])
        # Every key is compared (no short cut on the first match): the time taken does
        # not tell which of the two headers was right.
        verdicts = [self.accepts(k) for k in keys]
        if any(verdicts):
            await self.app(scope, receive, send)
            return
        await self._refuse(scope, receive, send, wrong=bool(keys))

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, wrong: bool) -> None:
        if wrong:
            message = "the API key is not valid"
            challenge = f'{REALM}, error="invalid_token"'  # RFC 6750, section 3
        else:
            message = "this endpoint needs the server's API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
            challenge = REALM
        headers = {"WWW-Authenticate": challenge}
        if _has_body(scope.get("headers") or []):
            # Closing rather than reading (and discarding) a body from a client without the key.
            headers["Connection"] = "close"
        if self.metrics is not None:
            self.metrics.errors.labels(code="unauthorized", status="401").inc()
        response = JSONResponse({"error": "unauthorized", "message": message}, status_code=401, headers=headers)
        await response(scope, receive, send)
