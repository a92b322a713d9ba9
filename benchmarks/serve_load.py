"""Load test of `aiayn serve` on loopback: N concurrent clients, M requests in total.

Starts the server twice in subprocesses (dynamic batching on, then ``--no-batching``),
sends the same request stream to each, and reports throughput and p50/p90/p99 latency,
plus the mean batch size the server reports in ``/metrics``.

    python benchmarks/serve_load.py                          # a tiny random model built here
    python benchmarks/serve_load.py --checkpoint runs/demo --synthetic reverse   # the demo's model
    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --requests 200   # a running server

The helpers (``start_server``, ``run_load``) are also used by tests/serving/, so the tests
and this benchmark start servers the same way. ``--json`` alone writes
benchmarks/results/serve_load.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

# Where `--json` without a file name writes (one file per benchmark: docs/results.md quotes them).
RESULTS = Path(__file__).resolve().parent / "results"
READY_RE = re.compile(r"Uvicorn running on (http://\S+?:\d+)")


# --------------------------------------------------------------------- checkpoint


def make_tiny_checkpoint(out_dir: str | Path, seed: int = 0, max_len_b: int = 8) -> Path:
    """A checkpoint of the ``tiny`` preset with random weights and a word tokenizer trained
    on a few hundred sentences of the synthetic ``toy`` task. Translations are arbitrary
    but deterministic; ``decode.max_len_b`` keeps them short (a random model rarely says EOS).
    """
    import torch

    from aiayn.checkpoint.directory import save_checkpoint
    from aiayn.config import Config, DataConfig, DecodeConfig, model_preset
    from aiayn.data.synthetic import generate
    from aiayn.model import build_model
    from aiayn.text.tokenizer import train_tokenizer

    out_dir = Path(out_dir)
    pairs = generate("toy", 400, seed=seed, min_len=3, max_len=10)
    tok = train_tokenizer([s for s, _ in pairs], [t for _, t in pairs], out_dir / "spm", vocab_size=200,
                          joint=True, model_type="word")
    vocab = tok.src_vocab_size
    torch.manual_seed(seed)
    cfg = Config(model=model_preset("tiny", src_vocab_size=vocab, tgt_vocab_size=vocab),
                 data=DataConfig(src_lang="en", tgt_lang="xx", synthetic="toy", spm_model_type="word"),
                 decode=DecodeConfig(beam=4, max_len_a=1.0, max_len_b=max_len_b))
    model = build_model(cfg.model).eval()
    path = save_checkpoint(out_dir / "checkpoint", model, cfg, tokenizer=tok, state={"step": 0})
    (out_dir / "sentences.txt").write_text("\n".join(s for s, _ in pairs) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------- server


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    lines: list[str] = field(default_factory=list)  # the server's log, for failure messages

    def log(self) -> str:
        return "".join(self.lines[-80:])

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def launch_server(checkpoint: str | Path, *args: str, timeout: float = 120.0,
                  env: dict[str, str] | None = None) -> ServerProcess:
    """Start ``aiayn serve`` on a free loopback port (port 0: the OS picks, uvicorn logs
    which) and wait until it answers ``/health``."""
    cmd = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(checkpoint), "--host", "127.0.0.1",
           "--port", "0", "--log-level", "info", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    server = ServerProcess(proc, "")
    ready = threading.Event()

    def pump() -> None:  # drain the pipe for the server's whole life, or it blocks when full
        assert proc.stdout is not None
        for line in proc.stdout:
            server.lines.append(line)
            m = READY_RE.search(line)
            if m and not server.url:
                server.url = m.group(1)
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    ready.wait(timeout)
    while server.url and time.monotonic() < deadline:
        try:
            if httpx.get(f"{server.url}/health", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop(5)
    raise RuntimeError(f"aiayn serve did not start within {timeout:.0f} s:\n{server.log()}")


@contextlib.contextmanager
def start_server(checkpoint: str | Path, *args: str, timeout: float = 120.0) -> Iterator[ServerProcess]:
    server = launch_server(checkpoint, *args, timeout=timeout)
    try:
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------- load


# What dynamic batching must achieve against one request at a time under the default load.
BATCHING_MIN_SPEEDUP = 1.2
BATCHING_MIN_SENTENCES = 1.5


@dataclass
class LoadResult:
    label: str
    requests: int
    clients: int
    failures: int
    seconds: float
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_batch_sentences: float | None = None
    status_codes: dict[str, int] = field(default_factory=dict)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def _scrape(metrics_text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", metrics_text, re.M)
    return float(m.group(1)) if m else 0.0


async def _load(url: str, sentences: Sequence[str], requests: int, clients: int, texts_per_request: int,
                body_extra: dict, seed: int,
                expected: Mapping[str, str] | None) -> tuple[list[float], dict[str, int], float]:
    rng = random.Random(seed)
    bodies = [{"texts": [rng.choice(sentences) for _ in range(texts_per_request)], **body_extra}
              for _ in range(requests)]
    latencies: list[float] = []
    codes: dict[str, int] = {}
    next_index = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def worker() -> None:
            nonlocal next_index
            while next_index < len(bodies):
                body = bodies[next_index]
                next_index += 1
                start = time.perf_counter()
                try:
                    r = await client.post("/v1/translate", json=body)
                    code = str(r.status_code)
                    if r.status_code == 200 and len(r.json()["translations"]) != len(body["texts"]):
                        code = "bad_payload"
                    elif r.status_code == 200 and expected is not None and \
                            r.json()["translations"] != [expected[t] for t in body["texts"]]:
                        code = "wrong_translation"
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                latencies.append(time.perf_counter() - start)
                codes[code] = codes.get(code, 0) + 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        seconds = time.perf_counter() - start
    return latencies, codes, seconds


def run_load(url: str, sentences: Sequence[str], *, requests: int = 1000, clients: int = 16,
             texts_per_request: int = 1, body_extra: dict | None = None, label: str = "",
             seed: int = 0, expected: Mapping[str, str] | None = None) -> LoadResult:
    """``clients`` closed-loop clients (each sends its next request when the last returns).
    With ``expected`` (source -> translation), an answer that differs counts as a failure
    (status ``wrong_translation``)."""
    before = httpx.get(f"{url}/metrics", timeout=30).text
    latencies, codes, seconds = asyncio.run(
        _load(url, sentences, requests, clients, texts_per_request, body_extra or {}, seed, expected))
    after = httpx.get(f"{url}/metrics", timeout=30).text
    batches = _scrape(after, "aiayn_batches_total") - _scrape(before, "aiayn_batches_total")
    sents = _scrape(after, "aiayn_sentences_total") - _scrape(before, "aiayn_sentences_total")
    lat = sorted(x * 1000 for x in latencies)
    return LoadResult(
        label=label, requests=requests, clients=clients, failures=sum(v for k, v in codes.items() if k != "200"),
        seconds=round(seconds, 3), throughput_rps=round(requests / seconds, 2),
        p50_ms=round(_percentile(lat, 50), 1), p90_ms=round(_percentile(lat, 90), 1),
        p99_ms=round(_percentile(lat, 99), 1),
        mean_batch_sentences=round(sents / batches, 2) if batches else None, status_codes=codes)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def markdown(results: Sequence[LoadResult]) -> str:
    rows = ["| server | requests | clients | failures | throughput (req/s) | p50 (ms) | p90 (ms) | p99 (ms) "
            "| mean batch (sentences) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        rows.append(f"| {r.label} | {r.requests} | {r.clients} | {r.failures} | {r.throughput_rps} | {r.p50_ms} "
                    f"| {r.p90_ms} | {r.p99_ms} | {r.mean_batch_sentences} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="checkpoint to serve (default: a tiny random model built in a temp dir)")
    p.add_argument("--url", help="load an already running server instead (one run, no comparison)")
    p.add_argument("--inputs", help="source sentences, one per line (default: from the checkpoint's builder)")
    p.add_argument("--synthetic", choices=("copy", "reverse", "sort", "toy"),
                   help="inputs: 500 sources of this built-in task (e.g. reverse for the demo's checkpoint)")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--texts-per-request", type=int, default=1)
    p.add_argument("--beam", type=int, default=None)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server (default 1)")
    p.add_argument("--window-ms", type=float, default=5.0)
    p.add_argument("--json", dest="json_out", nargs="?", const=str(RESULTS / "serve_load.json"), metavar="FILE",
                   help="also write the results as JSON to FILE (no FILE: benchmarks/results/serve_load.json)")
    args = p.parse_args(argv)

    extra = {"beam": args.beam} if args.beam else {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint
        inputs = Path(args.inputs) if args.inputs else None
        if args.url is None and checkpoint is None:
            checkpoint = make_tiny_checkpoint(tmp)
            inputs = inputs or Path(tmp) / "sentences.txt"
        if args.synthetic:
            from aiayn.data.synthetic import generate

            sentences = [src for src, _ in generate(args.synthetic, 500, seed=12345)]
        elif inputs is None:
            raise SystemExit("--inputs FILE or --synthetic TASK is needed with --checkpoint or --url")
        else:
            sentences = [s for s in inputs.read_text(encoding="utf-8").splitlines() if s.strip()]
        results = []
        if args.url:
            results.append(run_load(args.url, sentences, requests=args.requests, clients=args.clients,
                                    texts_per_request=args.texts_per_request, body_extra=extra, label=args.url))
        else:
            common = ["--threads", str(args.threads)]
            for label, flags in (("dynamic batching", ["--batch-window-ms", str(args.window_ms)]),
                                 ("one at a time (--no-batching)", ["--no-batching"])):
                with start_server(checkpoint, *common, *flags) as server:
                    # A short warm-up so both runs start with a loaded, warmed-up model.
                    run_load(server.url, sentences, requests=min(32, args.requests), clients=args.clients,
                             texts_per_request=args.texts_per_request, body_extra=extra, seed=1)
                    results.append(run_load(server.url, sentences, requests=args.requests, clients=args.clients,
                                            texts_per_request=args.texts_per_request, body_extra=extra,
                                            label=label))
                print(json.dumps(asdict(results[-1])), flush=True)
    print()
    print(f"machine: {machine()}")
    print(f"command: python benchmarks/serve_load.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(markdown(results))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({"machine": machine(), "results": [asdict(r) for r in results]},
                                                  indent=1), encoding="utf-8")
    if any(r.failures for r in results):
        return 1
    if not args.url:
        # Batching must pay off under load: batches of more than one sentence on average, and
        # more requests per second than one at a time (a measured claim, so it lives here and
        # not in the test suite, whose machines are shared).
        batched, single = results
        speedup = batched.throughput_rps / single.throughput_rps
        print(f"batching: {speedup:.2f}x the throughput of one at a time, "
              f"{batched.mean_batch_sentences} sentences per batch")
        if speedup <= BATCHING_MIN_SPEEDUP or (batched.mean_batch_sentences or 0) <= BATCHING_MIN_SENTENCES:
            print(f"batching did not pay off (expected > {BATCHING_MIN_SPEEDUP}x and > "
                  f"{BATCHING_MIN_SENTENCES} sentences per batch)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
