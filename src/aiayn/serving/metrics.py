"""Prometheus text-format metrics for the server, written by hand.

The service needs a handful of counters, gauges and histograms; a small thread-safe
registry avoids another dependency (prometheus_client) for that. The request path is
updated from the event loop, the batch metrics from the model's worker thread, hence
the lock. Format: https://prometheus.io/docs/instrumenting/exposition_formats/
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

Labels = tuple[tuple[str, str], ...]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _fmt_labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    items = list(labels) + ([extra] if extra else [])
    if not items:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if float(x).is_integer():
        return str(int(x))
    return repr(float(x))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        self.name = name
        self.help = help_text
        self._lock = lock

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}", *self._samples()]

    def _samples(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        super().__init__(name, help_text, lock)
        self._values: dict[Labels, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        with self._lock:
            return self._values.get(tuple(sorted(labels.items())), 0.0)

    def _samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        if not items:  # an unlabelled counter is exported as 0 from the start
            items = [((), 0.0)]
        return [f"{self.name}{_fmt_labels(k)} {_num(v)}" for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = float(value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, lock: threading.Lock, buckets: Sequence[float]) -> None:
        super().__init__(name, help_text, lock)
        self.buckets = tuple(sorted(buckets)) + (math.inf,)
        self._series: dict[Labels, list[float]] = {}  # per label set: bucket counts..., sum, count

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            s = self._series.setdefault(key, [0.0] * (len(self.buckets) + 2))
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    s[i] += 1  # Prometheus buckets are cumulative
            s[-2] += value
            s[-1] += 1

    def count(self, **labels: str) -> float:
        with self._lock:
            s = self._series.get(tuple(sorted(labels.items())))
            return s[-1] if s else 0.0

    def _samples(self) -> list[str]:
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        if not items:
            items = [((), [0.0] * (len(self.buckets) + 2))]
        out = []
        for labels, s in items:
            for bound, n in zip(self.buckets, s):
                out.append(f"{self.name}_bucket{_fmt_labels(labels, ('le', _num(bound)))} {_num(n)}")
            out.append(f"{self.name}_sum{_fmt_labels(labels)} {_num(s[-2])}")
            out.append(f"{self.name}_count{_fmt_labels(labels)} {_num(s[-1])}")
        return out


class ServerMetrics:
    """Every metric the server exports, rendered by :meth:`render` for ``GET /metrics``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        lk = self._lock
        self.requests = Counter("aiayn_http_requests_total", "HTTP requests by path and status code.", lk)
        self.errors = Counter("aiayn_http_errors_total", "HTTP requests answered with an error, by error code.", lk)
        self.latency = Histogram("aiayn_http_request_duration_seconds",
                                 "Latency of HTTP requests, by path.", lk, LATENCY_BUCKETS)
        self.in_flight = Gauge("aiayn_http_requests_in_flight", "HTTP requests being served now.", lk)
        self.batch_sentences = Histogram("aiayn_batch_sentences", "Sentences per model batch.", lk, BATCH_BUCKETS)
        self.batch_requests = Histogram("aiayn_batch_requests", "Requests gathered into one model batch.",
                                        lk, BATCH_BUCKETS)
        self.batches = Counter("aiayn_batches_total", "Model batches run.", lk)
        self.batch_failures = Counter("aiayn_batch_failures_total",
                                      "Model batches that raised (their requests were retried one by one).", lk)
        self.sentences = Counter("aiayn_sentences_total", "Sentences translated.", lk)
        self.src_tokens = Counter("aiayn_source_tokens_total", "Source tokens translated.", lk)
        self.tgt_tokens = Counter("aiayn_target_tokens_total", "Target tokens generated.", lk)
        self.model_seconds = Counter("aiayn_model_seconds_total", "Seconds the model spent translating.", lk)
        self.tokens_per_s = Gauge("aiayn_target_tokens_per_second",
                                  "Target tokens per second of model time, over the last batch.", lk)
        self.queue_depth = Gauge("aiayn_queue_requests", "Requests waiting for the model.", lk)
        self.rejected = Counter("aiayn_queue_rejected_total", "Requests refused with 503 because the queue was full.",
                                lk)
        self.connections_open = Gauge("aiayn_http_connections_open", "Open HTTP connections.", lk)
        self.connections_timeouts = Counter("aiayn_http_connection_timeouts_total",
                                            "Connections closed for missing the header or body timeout, by phase.", lk)
        self.connections_evicted = Counter("aiayn_http_connections_evicted_total",
                                           "Connections waiting for headers closed to make room for a new one.", lk)
        self.connections_rejected = Counter("aiayn_http_connections_rejected_total",
                                            "New connections refused with 503 at --max-connections.", lk)

    def all(self) -> list[_Metric]:
        return [self.requests, self.errors, self.latency, self.in_flight, self.batches, self.batch_failures,
                self.batch_sentences, self.batch_requests, self.sentences, self.src_tokens, self.tgt_tokens,
                self.model_seconds, self.tokens_per_s, self.queue_depth, self.rejected, self.connections_open,
                self.connections_timeouts, self.connections_evicted, self.connections_rejected]

    def render(self) -> str:
        lines: list[str] = []
        for m in self.all():
            lines.extend(m.render())
        return "\n".join(lines) + "\n"
