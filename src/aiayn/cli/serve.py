"""`aiayn serve`: the HTTP translation service and the attention page (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiayn.cli import options
from aiayn.errors import AiaynError
from aiayn.runtime.process import on_a_passing_thread

if TYPE_CHECKING:
    import torch

    from aiayn.inference.protocol import TranslatorProtocol
    from aiayn.inference.translator import Translator

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="HTTP translation service with an attention page",
        description="Serve a checkpoint over HTTP: POST /v1/translate, GET /v1/model, /health, /metrics, "
                    "the attention page at / and the OpenAPI docs at /docs. Needs the 'serve' extra "
                    "(pip install 'aiayn[serve]').")
    model = p.add_mutually_exclusive_group(required=True)
    options.add_checkpoint(model, several=False, required=False)
    options.add_ctranslate2(model)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    options.add_device_flags(p)
    options.add_compile(p, "on a CPU, for a model large enough to gain from it, the server answers "
                           "eagerly while it compiles in the background, then switches")
    p.add_argument("--compute-type", default="default",
                   help="with --ctranslate2: CTranslate2's compute type (default: as exported; int8, "
                        "int8_float32, float32, bfloat16, ...)")
    lim = p.add_argument_group("request limits")
    lim.add_argument("--max-texts", type=int, default=64, help="texts per request (default 64)")
    lim.add_argument("--max-chars", type=int, default=2000, help="characters per text (default 2000)")
    lim.add_argument("--max-body-bytes", type=int, default=1_000_000, help="request body size (default 1 MB)")
    lim.add_argument("--max-attention-values", type=int, default=1_000_000,
                     help="cross-attention weights one request with attention: true may return, bounded by "
                          "layers x heads x longest allowed output x source tokens, summed over its texts "
                          "(default 1,000,000: about 10 MB of JSON)")
    con = p.add_argument_group("connections (slow or idle clients)")
    con.add_argument("--header-timeout", type=float, default=10.0,
                     help="seconds a connection may take to send a request's headers, from connecting or from "
                          "its previous response (default 10); then 408 and closed")
    con.add_argument("--keep-alive-timeout", type=float, default=30.0,
                     help="seconds a connection that has had an answer may stay idle before its next request "
                          "(default 30; then its headers are due within --header-timeout)")
    con.add_argument("--body-timeout", type=float, default=30.0,
                     help="seconds a request's body may take to arrive after its headers (default 30)")
    con.add_argument("--max-connections", type=int, default=4096,
                     help="open connections (the file-descriptor limit is raised to fit); at the cap a new one "
                          "replaces the one waiting longest for its headers, or gets 503 + Retry-After if all are "
                          "busy (default 4096)")
    bat = p.add_argument_group("dynamic batching")
    bat.add_argument("--queue-size", type=int, default=256,
                     help="requests allowed to wait; more get 503 + Retry-After (default 256)")
    bat.add_argument("--batch-window-ms", type=float, default=5.0,
                     help="how long the oldest waiting request may wait for others to join its batch (default 5)")
    bat.add_argument("--max-batch-tokens", type=int, default=4096,
                     help="padded source tokens per model batch (default 4096)")
    bat.add_argument("--max-batch-sentences", type=int, default=64, help="sentences per model batch (default 64)")
    bat.add_argument("--no-batching", action="store_true",
                     help="translate requests one at a time, each as its own model batch")
    _add_access_flags(p)
    p.add_argument("--graceful-timeout", type=float, default=30.0,
                   help="seconds to let in-flight requests finish on SIGTERM/Ctrl+C (default 30)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--access-log", action="store_true",
                   help="log one line per request (uvicorn's access log, at --log-level info or debug; "
                        "default off)")
    p.set_defaults(func=run)


# The variable --api-key falls back to: a key given there does not show in `ps`.
API_KEY_ENV = "AIAYN_API_KEY"


def _add_access_flags(p: argparse.ArgumentParser) -> None:
    acc = p.add_argument_group("access")
    acc.add_argument("--api-key", metavar="KEY",
                     help=f"require this key on every request but /health, the page and the docs, as "
                          f"'Authorization: Bearer KEY' or 'X-API-Key: KEY' (default: ${API_KEY_ENV}, "
                          "which keeps the key out of `ps`; this flag wins over it; neither: no key)")
    acc.add_argument("--cors-origin", action="append", metavar="ORIGIN", dest="cors_origins",
                     help="let pages on this origin (scheme://host[:port], or * for any) call the API from a "
                          "browser; repeatable (default: no CORS headers)")


def _check(args: argparse.Namespace) -> None:
    for name in ("max_texts", "max_chars", "max_body_bytes", "max_attention_values", "queue_size", "max_batch_tokens",
                 "max_batch_sentences", "max_connections"):
        if getattr(args, name) < 1:
            raise AiaynError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    for name in ("batch_window_ms", "header_timeout", "body_timeout", "keep_alive_timeout", "graceful_timeout"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < 0 or (value == 0 and name != "batch_window_ms"):
            raise AiaynError(f"--{name.replace('_', '-')}: must be a positive number of "
                             f"{'milliseconds' if name == 'batch_window_ms' else 'seconds'}, got {value}")
    if not 0 <= args.port <= 65535:
        raise AiaynError(f"--port: {args.port} is not a port number")
    if args.compile == "on" and args.ctranslate2:
        raise AiaynError("--compile: compiles an aiayn checkpoint's decoding step; not for --ctranslate2")


def api_key(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The key to require: ``--api-key`` if given, else ``$AIAYN_API_KEY`` if set, else
    None (no key). A set but empty or unusable key is an error, never "no key"."""
    from aiayn.serving.auth import check_api_key

    if args.api_key is not None:
        return check_api_key(args.api_key, "--api-key")
    if API_KEY_ENV in environ:
        return check_api_key(environ[API_KEY_ENV], f"${API_KEY_ENV}")
    return None


def cors_origins(args: argparse.Namespace) -> tuple[str, ...]:
    from aiayn.serving.auth import check_cors_origin

    return tuple(check_cors_origin(o) for o in args.cors_origins or ())


def uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``uvicorn.Config`` arguments that come from the command line."""
    return {
        "host": args.host, "port": args.port, "log_level": args.log_level, "access_log": args.access_log,
        # The connection timers close idle connections; uvicorn's keep-alive timer backs them up.
        "timeout_keep_alive": math.ceil(max(args.header_timeout, args.keep_alive_timeout)) + 1,
        "timeout_graceful_shutdown": args.graceful_timeout,
    }


def _warn_if_exposed(host: str, key: str | None) -> None:
    if _is_loopback(host):
        return
    if key is None:
        print(f"aiayn serve: warning: listening on {host}, reachable from other machines, and anyone who can "
              f"reach it may use it: set an API key (--api-key or ${API_KEY_ENV})", file=sys.stderr)
    else:
        print(f"aiayn serve: warning: listening on {host} over plain HTTP: the API key crosses the network "
              "in clear unless a proxy terminates TLS in front of the server", file=sys.stderr)


# File descriptors the process needs besides client connections (model files, logs, ...).
_SPARE_FDS = 256


def fit_file_limit(max_connections: int) -> int:
    """Raise the soft open-files limit so ``max_connections`` fit (as nginx's
    worker_rlimit_nofile does; the default soft limit is often 1,024); if the hard limit is
    lower, serve fewer connections and say so."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + _SPARE_FDS
    if soft != resource.RLIM_INFINITY and soft < need:
        new_soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        soft = new_soft
    if soft != resource.RLIM_INFINITY and soft < need:
        fitted = max(1, soft - _SPARE_FDS)
        print(f"aiayn serve: warning: --max-connections {max_connections} needs {need} open files and the limit "
              f"is {soft} (ulimit -n): serving at most {fitted} connections", file=sys.stderr)
        return fitted
    return max_connections


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _translator(args: argparse.Namespace, device: torch.device) -> TranslatorProtocol:
    if args.ctranslate2:
        from aiayn.interop.ct2_translator import CTranslate2Translator

        # CTranslate2 names GPUs "cuda" and takes the index separately.
        return CTranslate2Translator(args.ctranslate2, device=device.type,
                                     compute_type=args.compute_type, threads=max(args.threads, 0))
    from aiayn.inference.translator import Translator

    dtype = options.dtype(args, device)
    # Loading and compiling run on threads that end: the batcher's thread alone keeps a
    # thread team (aiayn.runtime.process.on_a_passing_thread).
    translator = on_a_passing_thread(lambda: Translator.from_checkpoint(
        args.checkpoint, device=device, dtype=dtype, compile=args.compile == "on"))
    options.say_dtype(dtype)
    if args.compile == "on":
        on_a_passing_thread(lambda: _compile_now(translator))
    return translator


# What serving translates with the compiled steps before they answer: a sentence alone and a
# batch (one compiled step serves both). Another beam size compiles when first asked for.
WARM_UP = (["Compiling."], ["Compiling.", "Compiling a batch."])
# The lines a server is counted on to translate, for `--compile auto`'s estimate.
SERVER_LINES = 100_000


def _compile_now(translator: Translator) -> None:
    """Compile before serving: requests meet the warm-up's shape families compiled."""
    start = time.perf_counter()
    for batch in WARM_UP:
        translator.translate(batch)
    log.info("compiled the decoding step in %.0f s", time.perf_counter() - start)


def compile_in_background(translator: Translator) -> threading.Thread:
    """``--compile auto``: compile the steps on a thread of their own while the server answers
    with the eager ones, then switch to them (``Translator.use_compiled``); a failure leaves
    the eager steps serving. Returns the thread, started."""

    def work() -> None:
        start = time.perf_counter()
        try:
            translator.use_compiled(warm_up=WARM_UP)
        except Exception as exc:  # noqa: BLE001 - the eager steps keep serving
            log.warning("compiling in the background failed (%s: %s); serving eagerly", type(exc).__name__, exc)
            return
        log.info("compiled the decoding step in the background in %.0f s; serving with it", time.perf_counter() - start)

    thread = threading.Thread(target=work, name="aiayn-compile", daemon=True)
    thread.start()
    return thread


def run(args: argparse.Namespace) -> int:
    _check(args)
    try:
        import uvicorn

        from aiayn.serving.app import ServeSettings, create_app
        from aiayn.serving.connections import ConnectionLimits, guarded_protocol
    except ModuleNotFoundError as exc:
        raise AiaynError(f"aiayn serve needs the 'serve' extra ({exc.name} is missing): "
                         "pip install 'aiayn[serve]'") from None

    key, origins = api_key(args, os.environ), cors_origins(args)  # before the model loads: mistakes fail fast
    device = options.device(args)
    translator = _translator(args, device)
    settings = ServeSettings(
        max_texts=args.max_texts, max_chars=args.max_chars, max_body_bytes=args.max_body_bytes,
        max_attention_values=args.max_attention_values,
        queue_size=args.queue_size, batch_window_ms=args.batch_window_ms, max_batch_tokens=args.max_batch_tokens,
        max_batch_sentences=args.max_batch_sentences, batching=not args.no_batching,
        checkpoint=str(args.checkpoint or args.ctranslate2),
        # As given, "auto" as resolved: what /v1/model reports.
        device=device.type if args.device == "auto" else args.device,
        # None: the translator's own, "auto" as resolved.
        dtype=f"ctranslate2 {args.compute_type}" if args.ctranslate2 else None,
        api_key=key, cors_origins=origins)
    app = create_app(translator, settings)
    _warn_if_exposed(args.host, key)
    limits = ConnectionLimits(header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                              max_connections=fit_file_limit(args.max_connections),
                              keep_alive_s=args.keep_alive_timeout)
    protocol = guarded_protocol(limits, app.state.metrics, retry_after_s=settings.retry_after_s)
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, **uvicorn_options(args)))
    if args.compile == "auto" and not args.ctranslate2 and translator.compile_pays(SERVER_LINES):  # type: ignore[attr-defined]
        compile_in_background(translator)  # type: ignore[arg-type]
    # uvicorn handles SIGINT/SIGTERM: it stops accepting, lets in-flight requests finish,
    # then runs the app's shutdown (which drains the batcher's queue).
    server.run()
    return 0
