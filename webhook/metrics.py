"""Prometheus metrics of the webhook: reviews by decision, latency, certificate expiry."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from webhook.admission import Answer

CONTENT_TYPE = CONTENT_TYPE_LATEST
DECISIONS = ("allowed", "patched", "denied", "invalid")
_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def decision_label(answer: Answer) -> str:
    """The decision an answer counts under: allowed (unchanged), patched, denied or invalid."""
    decision = answer.decision
    if decision is None:
        return "invalid"
    if not decision.allowed:
        return "denied"
    return "patched" if decision.patch else "allowed"


class Metrics:
    """The webhook's metrics in a registry of their own."""

    def __init__(self, certificate_seconds_left: Callable[[], float]) -> None:
        """Args: certificate_seconds_left: read at each scrape for the expiry gauge."""
        self.registry = CollectorRegistry(auto_describe=True)
        reviews = Counter("vcuda_webhook_reviews", "AdmissionReviews answered, by decision",
                          ["decision"], registry=self.registry)
        # Children bound once: labels() per request would cost a lookup each time.
        self._reviews = {d: reviews.labels(d) for d in DECISIONS}
        self._latency = Histogram("vcuda_webhook_review_seconds",
                                  "Time from request to answer of /mutate",
                                  buckets=_LATENCY_BUCKETS, registry=self.registry)
        expiry = Gauge("vcuda_webhook_certificate_expiry_seconds",
                       "Seconds until the serving certificate expires",
                       registry=self.registry)
        expiry.set_function(certificate_seconds_left)

    def observe(self, decision: str, seconds: float) -> None:
        """Count one review under ``decision`` and record how long it took."""
        self._reviews[decision].inc()
        self._latency.observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
