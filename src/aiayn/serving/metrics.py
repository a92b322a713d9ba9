"""The server's Prometheus metrics, kept by ``prometheus_client``.

Each :class:`ServerMetrics` has its own :class:`~prometheus_client.CollectorRegistry`
rather than the library's global one: two apps in one process (tests, or an app embedded
in another service) then count separately and never collide on a metric name. The names
and labels are those of the hand-written exporter this replaced, so dashboards keep
working. prometheus_client's metrics are thread-safe: the request path updates them from
the event loop, the batch metrics from the model's worker thread.

The registry also carries prometheus_client's process collector (``process_*``: resident
memory, CPU seconds, open file descriptors), its platform collector (``python_info``) and
its garbage-collector collector (``python_gc_*``).
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# What GET /metrics answers with (the text format prometheus_client writes).
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """Every metric the server exports, in :attr:`registry`; :meth:`render` writes them for
    ``GET /metrics``.

    Label names are declared in alphabetical order, the order in which they are written,
    as the hand-written exporter did.
    """

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("aiayn_http_requests_total", "HTTP requests by path and status code.",
                                ("code", "path"), registry=r)
        self.errors = Counter("aiayn_http_errors_total", "HTTP requests answered with an error, by error code.",
                              ("code", "status"), registry=r)
        self.latency = Histogram("aiayn_http_request_duration_seconds", "Latency of HTTP requests, by path.",
                                 ("path",), buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("aiayn_http_requests_in_flight", "HTTP requests being served now.", registry=r)
        self.batches = Counter("aiayn_batches_total", "Model batches run.", registry=r)
        self.batch_failures = Counter("aiayn_batch_failures_total",
                                      "Model batches that raised (their requests were retried one by one).",
                                      registry=r)
        self.batch_sentences = Histogram("aiayn_batch_sentences", "Sentences per model batch.",
                                         buckets=BATCH_BUCKETS, registry=r)
        self.batch_requests = Histogram("aiayn_batch_requests", "Requests gathered into one model batch.",
                                        buckets=BATCH_BUCKETS, registry=r)
        self.sentences = Counter("aiayn_sentences_total", "Sentences translated.", registry=r)
        self.src_tokens = Counter("aiayn_source_tokens_total", "Source tokens translated.", registry=r)
        self.tgt_tokens = Counter("aiayn_target_tokens_total", "Target tokens generated.", registry=r)
        self.model_seconds = Counter("aiayn_model_seconds_total", "Seconds the model spent translating.", registry=r)
        self.tokens_per_s = Gauge("aiayn_target_tokens_per_second",
                                  "Target tokens per second of model time, over the last batch.", registry=r)
        self.queue_depth = Gauge("aiayn_queue_requests", "Requests waiting for the model.", registry=r)
        self.rejected = Counter("aiayn_queue_rejected_total", "Requests refused with 503 because the queue was full.",
                                registry=r)
        self.abandoned = Counter("aiayn_queue_abandoned_total",
                                 "Requests dropped from the queue because their client disconnected.", registry=r)
        self._add_connection_metrics()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)

    def _add_connection_metrics(self) -> None:
        r = self.registry
        self.connections_open = Gauge("aiayn_http_connections_open", "Open HTTP connections.", registry=r)
        self.connections_timeouts = Counter(
            "aiayn_http_connection_timeouts_total",
            "Connections closed for missing the header or body timeout, by phase.", ("phase",), registry=r)
        self.connections_evicted = Counter(
            "aiayn_http_connections_evicted_total",
            "Connections waiting for headers closed to make room for a new one.", ("reason",), registry=r)
        self.connections_rejected = Counter(
            "aiayn_http_connections_rejected_total",
            "New connections refused with 503 at --max-connections.", ("reason",), registry=r)

    def render(self) -> bytes:
        """The registry in Prometheus' text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def value(self, sample: str, **labels: str) -> float:
        """One sample's current value (0 when it has not been written yet), e.g.
        ``value("aiayn_http_requests_total", code="200", path="/health")``."""
        found = self.registry.get_sample_value(sample, labels)
        return 0.0 if found is None else found
