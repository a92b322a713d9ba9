"""Stress checks of `aiayn serve` on loopback, the serving figures of docs/results.md:

- ``clients``: N closed-loop clients (64, 400); a 503 must carry ``Retry-After``, which
  the client honours before sending again; anything but 200 or such a 503 is a failure;
- ``slow``: S slow clients (2,000) that each send one header byte every few seconds,
  while 16 normal clients send requests; the same normal load is first run alone on the
  same server, so the two rows compare directly; then K clients stall mid-body and the
  server gets SIGTERM: the time it takes to exit;
- ``rss``: the server's resident memory every 1,000 requests over 20,000.

    python benchmarks/serve_stress.py                      # all three, a tiny random model
    python benchmarks/serve_stress.py --only clients --clients 64,400
    python benchmarks/serve_stress.py --checkpoint runs/demo --synthetic reverse

Helpers (tiny checkpoint, server process, closed-loop load) come from serve_load.py.
``--json`` alone writes benchmarks/results/serve_stress.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psutil

from serve_load import RESULTS, _percentile, _scrape, launch_server, machine, make_tiny_checkpoint, start_server

# ------------------------------------------------------------------ closed-loop clients


async def _clients(url: str, sentences: Sequence[str], requests: int, clients: int, seed: int = 0) -> dict[str, Any]:
    """``clients`` clients sharing ``requests`` requests; a 503 with Retry-After is waited
    out and the request sent again (counted); returns codes, latencies of the 200s."""
    rng = random.Random(seed)
    todo = [{"texts": [rng.choice(sentences)]} for _ in range(requests)]
    codes: Counter[str] = Counter()
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one(body: dict) -> None:
            start = time.perf_counter()
            while True:
                try:
                    r = await client.post("/v1/translate", json=body)
                except httpx.HTTPError as exc:
                    codes[type(exc).__name__] += 1
                    return
                if r.status_code == 503 and "retry-after" in r.headers:
                    codes["503 + Retry-After"] += 1
                    await asyncio.sleep(float(r.headers["retry-after"]) * rng.uniform(0.5, 1.5))
                    continue
                codes[str(r.status_code)] += 1
                if r.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                return

        async def worker() -> None:
            while todo:
                await one(todo.pop())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        seconds = time.perf_counter() - start
    lat = sorted(x * 1000 for x in latencies)
    failures = sum(n for code, n in codes.items() if code not in ("200", "503 + Retry-After"))
    return {"clients": clients, "requests": requests, "seconds": round(seconds, 2),
            "throughput_rps": round(len(lat) / seconds, 1), "p50_ms": round(_percentile(lat, 50), 1),
            "p99_ms": round(_percentile(lat, 99), 1), "failures": failures, "codes": dict(codes)}


def run_clients(checkpoint: Path, sentences: Sequence[str], counts: Sequence[int], requests_per_client: int,
                server_args: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for n in counts:
        with start_server(checkpoint, *server_args) as srv:
            asyncio.run(_clients(srv.url, sentences, 32, 8, seed=1))  # warm-up
            row = asyncio.run(_clients(srv.url, sentences, n * requests_per_client, n))
            row["rss_mb"] = round(psutil.Process(srv.proc.pid).memory_info().rss / 2**20)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------ slow clients


async def _slowloris(url: str, n: int, byte_every_s: float, stop: asyncio.Event) -> Counter[str]:
    """``n`` clients sending a never-ending header one byte at a time; each reconnects
    when closed, so the pressure stays at ``n`` for the whole run."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    stats: Counter[str] = Counter()

    async def client(i: int) -> None:
        await asyncio.sleep(random.Random(i).uniform(0, byte_every_s))  # spread the connects
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                stats["connect_errors"] += 1
                await asyncio.sleep(byte_every_s)
                continue
            stats["connections"] += 1
            try:
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                while not stop.is_set():
                    await writer.drain()
                    try:
                        data = await asyncio.wait_for(reader.read(1024), byte_every_s)
                    except asyncio.TimeoutError:
                        writer.write(b"a")
                        continue
                    stats["answered_408" if data.startswith(b"HTTP/1.1 408") else "closed_by_server"] += 1
                    break
            except OSError:
                pass
            finally:
                stats["closed"] += 1
                writer.close()

    tasks = [asyncio.create_task(client(i)) for i in range(n)]
    await stop.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    return stats


async def _with_slow_clients(url: str, sentences: Sequence[str], n_slow: int, requests: int, clients: int,
                             byte_every_s: float, settle_s: float) -> tuple[dict[str, Any], Counter[str]]:
    stop = asyncio.Event()
    slow = asyncio.create_task(_slowloris(url, n_slow, byte_every_s, stop))
    await asyncio.sleep(settle_s)  # let the slow clients connect first
    row = await _clients(url, sentences, requests, clients, seed=2)
    stop.set()
    return row, await slow


def _shutdown_with_stalled_bodies(checkpoint: Path, server_args: Sequence[str], stalled: int) -> dict[str, Any]:
    import socket

    srv = launch_server(checkpoint, *server_args)
    parts = urlsplit(srv.url)
    socks = []
    for _ in range(stalled):
        s = socket.create_connection((parts.hostname, parts.port))
        s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{")
        socks.append(s)
    time.sleep(0.5)
    start = time.perf_counter()
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(600)
    seconds = time.perf_counter() - start
    for s in socks:
        s.close()
    return {"stalled_body_clients": stalled, "shutdown_s": round(seconds, 2), "exit": srv.proc.returncode}


def run_slow(checkpoint: Path, sentences: Sequence[str], n_slow: int, requests: int, server_args: Sequence[str],
             byte_every_s: float) -> dict[str, Any]:
    with start_server(checkpoint, *server_args) as srv:
        asyncio.run(_clients(srv.url, sentences, 32, 8, seed=1))
        alone = asyncio.run(_clients(srv.url, sentences, requests, 16))
        beside, stats = asyncio.run(_with_slow_clients(srv.url, sentences, n_slow, requests, 16, byte_every_s,
                                                       settle_s=3 * byte_every_s))
        metrics = httpx.get(f"{srv.url}/metrics", timeout=60).text
    out = {"alone": alone, "with_slow_clients": beside, "slow_clients": n_slow, "slow_stats": dict(stats),
           "timeouts": _scrape(metrics, 'aiayn_http_connection_timeouts_total{phase="headers"}'),
           "evicted": _scrape(metrics, 'aiayn_http_connections_evicted_total{reason="max_connections"}'),
           "rejected": _scrape(metrics, 'aiayn_http_connections_rejected_total{reason="max_connections"}'),
           "shutdown": _shutdown_with_stalled_bodies(checkpoint, server_args, stalled=50)}
    print(json.dumps(out), flush=True)
    return out


# ------------------------------------------------------------------ memory


def run_rss(checkpoint: Path, sentences: Sequence[str], requests: int, every: int,
            server_args: Sequence[str]) -> dict[str, Any]:
    series = []
    with start_server(checkpoint, *server_args) as srv:
        proc = psutil.Process(srv.proc.pid)
        failures = 0
        for done in range(0, requests, every):
            row = asyncio.run(_clients(srv.url, sentences, every, 16, seed=done))
            failures += row["failures"]
            series.append({"requests": done + every, "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                           "throughput_rps": row["throughput_rps"]})
            print(json.dumps(series[-1]), flush=True)
    return {"series": series, "failures": failures}


# ------------------------------------------------------------------ report


def report(results: dict[str, Any]) -> str:
    lines = []
    if "clients" in results:
        lines += ["| clients | requests | 200 | 503 + Retry-After (retried) | failures | req/s | p50 ms | p99 ms "
                  "| server RSS MB |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in results["clients"]:
            lines.append(f"| {r['clients']} | {r['requests']} | {r['codes'].get('200', 0)} "
                         f"| {r['codes'].get('503 + Retry-After', 0)} | {r['failures']} | {r['throughput_rps']} "
                         f"| {r['p50_ms']} | {r['p99_ms']} | {r['rss_mb']} |")
    if "slow" in results:
        s = results["slow"]
        lines += ["", "| normal traffic (16 clients) | requests | failures | req/s | p50 ms | p99 ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        for label, key in (("alone", "alone"), (f"beside {s['slow_clients']} slow clients", "with_slow_clients")):
            r = s[key]
            lines.append(f"| {label} | {r['requests']} | {r['failures']} | {r['throughput_rps']} | {r['p50_ms']} "
                         f"| {r['p99_ms']} |")
        lines.append(f"\nslow clients: {s['slow_stats']}; header timeouts {s['timeouts']:.0f}, evicted "
                     f"{s['evicted']:.0f}, refused {s['rejected']:.0f}; shutdown with "
                     f"{s['shutdown']['stalled_body_clients']} clients stalled mid-body: "
                     f"{s['shutdown']['shutdown_s']} s")
    if "rss" in results:
        series = results["rss"]["series"]
        lines += ["", "| requests | " + " | ".join(str(p["requests"]) for p in series) + " |",
                  "|---|" + "---:|" * len(series),
                  "| server RSS MB | " + " | ".join(str(p["rss_mb"]) for p in series) + " |",
                  f"\nfailures over {series[-1]['requests']} requests: {results['rss']['failures']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="checkpoint to serve (default: a tiny random model built in a temp dir)")
    p.add_argument("--synthetic", choices=("copy", "reverse", "sort", "toy"), help="inputs from this built-in task")
    p.add_argument("--only", choices=("clients", "slow", "rss"), action="append", help="run only these (repeatable)")
    p.add_argument("--clients", default="64,400", help="client counts of the clients check (default 64,400)")
    p.add_argument("--requests-per-client", type=int, default=20)
    p.add_argument("--slow-clients", type=int, default=2000)
    p.add_argument("--slow-requests", type=int, default=1000, help="normal requests beside the slow clients")
    p.add_argument("--byte-every", type=float, default=2.0, help="seconds between a slow client's bytes")
    p.add_argument("--rss-requests", type=int, default=20000)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server (default 1)")
    p.add_argument("--server-arg", action="append", default=[], help="extra `aiayn serve` argument (repeatable)")
    p.add_argument("--json", dest="json_out", nargs="?", const=str(RESULTS / "serve_stress.json"), metavar="FILE",
                   help="also write the results as JSON to FILE (no FILE: benchmarks/results/serve_stress.json)")
    args = p.parse_args(argv)
    only = set(args.only or ("clients", "slow", "rss"))
    server_args = ["--threads", str(args.threads), *args.server_arg]
    results: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv)}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(args.checkpoint) if args.checkpoint else make_tiny_checkpoint(tmp)
        if args.synthetic:
            from aiayn.data.synthetic import generate

            sentences = [src for src, _ in generate(args.synthetic, 500, seed=12345)]
        else:
            sentences = (checkpoint.parent / "sentences.txt").read_text(encoding="utf-8").split("\n")[:-1]
        if "clients" in only:
            counts = [int(x) for x in args.clients.split(",")]
            results["clients"] = run_clients(checkpoint, sentences, counts, args.requests_per_client, server_args)
        if "slow" in only:
            results["slow"] = run_slow(checkpoint, sentences, args.slow_clients, args.slow_requests, server_args,
                                       args.byte_every)
        if "rss" in only:
            results["rss"] = run_rss(checkpoint, sentences, args.rss_requests, 1000, server_args)
    print(f"\nmachine: {results['machine']}\ncommand: {results['command']}\n{report(results)}")
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(results, indent=1), encoding="utf-8")
    failed = [r["failures"] for r in results.get("clients", [])] + [results.get("rss", {}).get("failures", 0)]
    return 1 if any(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
