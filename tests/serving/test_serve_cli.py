"""`aiayn serve`'s access flags: --api-key / $AIAYN_API_KEY, --cors-origin and --access-log,
from the parser to uvicorn's configuration, and against a real server."""

from __future__ import annotations

import argparse
import time

import pytest
import torch

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi", reason="the 'serve' extra is not installed")
uvicorn = pytest.importorskip("uvicorn")

from aiayn.cli import serve  # noqa: E402
from aiayn.cli.main import build_parser, main  # noqa: E402
from aiayn.errors import ConfigError  # noqa: E402

TIMEOUT = 120.0


def parse(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--checkpoint", "ck", *flags])


# ------------------------------------------------------------------ parsing


def test_defaults() -> None:
    args = parse()
    assert (args.api_key, args.cors_origins, args.access_log) == (None, None, False)
    assert serve.api_key(args, {}) is None
    assert serve.cors_origins(args) == ()
    assert serve.uvicorn_options(args)["access_log"] is False


def test_the_flag_wins_over_the_environment() -> None:
    env = {"AIAYN_API_KEY": "from-env"}
    assert serve.api_key(parse("--api-key", "from-flag"), env) == "from-flag"
    assert serve.api_key(parse(), env) == "from-env"


@pytest.mark.parametrize(("flags", "env", "name"), [
    (("--api-key", ""), {}, "--api-key"),
    (("--api-key", "has space"), {"AIAYN_API_KEY": "fine"}, "--api-key"),
    ((), {"AIAYN_API_KEY": ""}, "$AIAYN_API_KEY"),  # set but empty: a mistake, never "no key"
    ((), {"AIAYN_API_KEY": "tab\tkey"}, "$AIAYN_API_KEY"),
])
def test_an_unusable_key_names_where_it_came_from(flags: tuple[str, ...], env: dict[str, str], name: str) -> None:
    with pytest.raises(ConfigError, match="^" + name.replace("$", r"\$") + ": "):
        serve.api_key(parse(*flags), env)


def test_cors_origins_repeat() -> None:
    args = parse("--cors-origin", "https://a.example", "--cors-origin", "HTTP://B.example:8080")
    assert serve.cors_origins(args) == ("https://a.example", "http://b.example:8080")


def test_access_log_reaches_uvicorns_config() -> None:
    args = parse("--access-log", "--port", "8123", "--host", "0.0.0.0", "--graceful-timeout", "7")
    options = serve.uvicorn_options(args)
    assert options["access_log"] is True
    # log_config=None: uvicorn would otherwise reconfigure this process's logging.
    config = uvicorn.Config(app=object(), **{**options, "log_config": None})
    assert (config.access_log, config.host, config.port, config.timeout_graceful_shutdown) == (True, "0.0.0.0",
                                                                                              8123, 7)


@pytest.mark.parametrize(("host", "key", "expected"), [
    ("127.0.0.1", None, ""), ("localhost", "k", ""), ("::1", None, ""),
    ("0.0.0.0", None, "anyone who can reach it may use it: set an API key (--api-key or $AIAYN_API_KEY)"),
    ("192.0.2.7", "k", "the API key crosses the network in clear unless a proxy terminates TLS"),
])
def test_warning_when_reachable_from_other_machines(host: str, key: str | None, expected: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    serve._warn_if_exposed(host, key)
    err = capsys.readouterr().err
    if expected:
        assert err.startswith(f"aiayn serve: warning: listening on {host}") and expected in err
        assert err.count("\n") == 1
    else:
        assert err == ""


@pytest.mark.parametrize(("flags", "env", "expect"), [
    (("--cors-origin", "page.example"), {}, "--cors-origin: 'page.example': not an origin"),
    (("--cors-origin", "https://page.example/"), {}, "--cors-origin: 'https://page.example/': an origin has no path"),
    (("--api-key", ""), {}, "--api-key: the API key is empty"),
    ((), {"AIAYN_API_KEY": ""}, "$AIAYN_API_KEY: the API key is empty"),
])
def test_mistakes_are_one_line_and_exit_2(flags: tuple[str, ...], env: dict[str, str], expect: str,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIAYN_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # The checkpoint does not exist: these are found before the model is loaded.
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--checkpoint", "missing-ck", "--threads", "1", *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith(f"aiayn serve: error: {expect}")
    assert err.count("\n") == 1 and "Traceback" not in err


# ------------------------------------------------------------------ a real server


def _wait_for_line(srv, text: str) -> str:
    """The server's log line containing ``text``, read as the log pump delivers it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in list(srv.lines):
            if text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no log line with {text!r}:\n{srv.log()}")


def test_key_from_the_environment(keyed_server) -> None:
    url, key = keyed_server.url, keyed_server.api_key
    r = httpx.post(f"{url}/v1/translate", json={"texts": ["a b"]}, timeout=TIMEOUT)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert r.headers["www-authenticate"].startswith("Bearer")
    # The body was never read: the connection is not reused.
    assert r.headers["connection"] == "close"
    # Without a body there is nothing left unread: keep-alive as usual.
    bodiless = httpx.get(f"{url}/v1/model", timeout=TIMEOUT)
    assert bodiless.status_code == 401 and bodiless.headers.get("connection") != "close"
    ok = httpx.post(f"{url}/v1/translate", json={"texts": ["a b"]}, timeout=TIMEOUT,
                    headers={"Authorization": f"Bearer {key}"})
    assert ok.status_code == 200 and len(ok.json()["translations"]) == 1
    assert httpx.get(f"{url}/metrics", timeout=TIMEOUT, headers={"X-API-Key": key}).status_code == 200
    assert httpx.get(f"{url}/health", timeout=TIMEOUT).status_code == 200
    assert httpx.get(f"{url}/", timeout=TIMEOUT).status_code == 200


def test_cors_on_a_real_server(keyed_server) -> None:
    r = httpx.options(f"{keyed_server.url}/v1/translate", timeout=TIMEOUT, headers={
        "Origin": keyed_server.cors_origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == keyed_server.cors_origin


def test_access_log(keyed_server, server) -> None:
    """On with --access-log: one line per request; off by default."""
    httpx.get(f"{keyed_server.url}/v1/model?probe=access-log", timeout=TIMEOUT)
    line = _wait_for_line(keyed_server, '"GET /v1/model?probe=access-log HTTP/1.1" 401')
    assert "127.0.0.1" in line
    # The shared server has answered requests (its /health probe at least), none logged.
    assert not any('HTTP/1.1" ' in line for line in server.lines), server.log()


def test_compile_is_refused_with_ctranslate2(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--ctranslate2", str(tmp_path), "--compile", "--threads", "1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("aiayn serve: error: --compile: compiles an aiayn checkpoint's decoding step")
    assert err.count("\n") == 1


def test_compile_compiles_one_sentence_and_a_batch_before_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both shape families (a lone source is specialised) are met before the first request."""
    from aiayn.inference.translator import Translator

    made: dict = {}

    class Recording:
        def translate(self, texts):
            made.setdefault("batches", []).append(len(texts))
            return texts

    def from_checkpoint(path, device, dtype, compile):
        made.update(path=path, compile=compile)
        return Recording()

    monkeypatch.setattr(Translator, "from_checkpoint", staticmethod(from_checkpoint))
    serve._translator(parse("--compile"), torch.device("cpu"))
    assert made == {"path": "ck", "compile": True, "batches": [1, 2]}
    made.clear()
    serve._translator(parse(), torch.device("cpu"))
    assert made == {"path": "ck", "compile": False}


def test_loading_and_compiling_run_on_threads_that_have_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the batcher's thread keeps a thread team (runtime.on_a_passing_thread); both
    steps run with the configured thread count."""
    import threading

    from aiayn.inference.translator import Translator

    seen: dict = {}

    class Recording:
        def translate(self, texts):
            seen.setdefault("compile", (threading.current_thread(), torch.get_num_threads()))
            return texts

    def from_checkpoint(path, device, dtype, compile):
        seen["load"] = (threading.current_thread(), torch.get_num_threads())
        return Recording()

    monkeypatch.setattr(Translator, "from_checkpoint", staticmethod(from_checkpoint))
    threads = torch.get_num_threads()
    serve._translator(parse("--compile"), torch.device("cpu"))
    for step in ("load", "compile"):
        thread, count = seen[step]
        assert thread is not threading.current_thread() and not thread.is_alive(), step
        assert count == threads, step
