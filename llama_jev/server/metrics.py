"""The server's Prometheus metrics, in a registry of each app's own (two apps in one process do not
collide). Labels are routes and statuses only: never text, identities or keys."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from llama_jev.server.protocol import ROUTES

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ServerMetrics:
    """Requests by route and status, candidates judged and unread, latency, in flight, queued, batch sizes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "llama_jev_requests",
            "HTTP requests answered, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.candidates = Counter(
            "llama_jev_candidates_judged", "Candidates (questions) judged and answered.", registry=self.registry
        )
        self.latency = Histogram(
            "llama_jev_request_duration_seconds",
            "Seconds from a request's head to its response, by route.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "llama_jev_requests_in_flight", "System One requests being judged now.", registry=self.registry
        )
        self.queued = Gauge(
            "llama_jev_requests_queued", "System One requests admitted and waiting for a slot.", registry=self.registry
        )
        self.uncertain = Counter(
            "llama_jev_uncertain_candidates",
            "Candidates answered 'uncertain' (0.5) because the judge cannot read them, by cause "
            "(state: no query text; question: not a relevance question).",
            ["cause"],
            registry=self.registry,
        )
        self.batch = Histogram(
            "llama_jev_batch_candidates",
            "Candidates per call of the judge (merged requests count together).",
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )

    def observe_request(self, path: str, status: int | None, seconds: float) -> None:
        """Count one answered request (an unknown path is counted as ``other``, a dropped one as ``none``)."""
        route = path if path in ROUTES else "other"
        self.requests.labels(route=route, status=str(status) if status is not None else "none").inc()
        self.latency.labels(route=route).observe(seconds)

    def text(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
