"""The server's Prometheus metrics, in a registry of its own (prometheus_client), served at
/metrics. Labelled by what was asked (signature, HTTP status, engine), never by client
address or API key: the series stay few however many clients there are."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

# Seconds a request took, from its first byte read to its answer: from a one-line search to
# a long request behind a full queue.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """requests (by path kind, signature and status), errors (by status), request latency,
    lines per batch, lines waiting in the batch queue, lines per request."""

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("serve_requests", "HTTP requests answered, by route, "
                                "signature and status", ["route", "signature", "status"],
                                registry=self.registry)
        self.errors = Counter("serve_errors", "requests answered with an error, by status",
                              ["status"], registry=self.registry)
        self.latency = Histogram("serve_request_seconds", "seconds from a request's arrival "
                                 "to its answer, predict requests by signature",
                                 ["signature"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.batch_lines = Histogram("serve_batch_lines", "lines (sentences) per searched "
                                     "batch", buckets=BATCH_BUCKETS, registry=self.registry)
        self.request_lines = Histogram("serve_request_lines", "lines (sentences) per predict "
                                       "request", buckets=BATCH_BUCKETS,
                                       registry=self.registry)
        self.queue_depth = Gauge("serve_queue_lines", "lines waiting in the batch queue",
                                 registry=self.registry)

    def observe(self, route, signature, status, seconds):
        self.requests.labels(route, signature or "", str(status)).inc()
        if status >= 400:
            self.errors.labels(str(status)).inc()
        if route == "predict":
            self.latency.labels(signature or "").observe(seconds)

    def exposition(self):
        """(body, content type) of the metrics in Prometheus' text format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
