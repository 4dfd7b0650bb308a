"""Prometheus metrics of the webhook: reviews by decision, latency, certificate expiry, guards,
the bound on vcuda-memory in force, and the release (also the extender's)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from runtime_hook.contract import VERSION
from webhook.admission import OUTCOMES

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BOUNDS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def build_info() -> GaugeMetricFamily:
    """``vcuda_build_info{version}`` at 1: which release answers, for dashboards and upgrades."""
    family = GaugeMetricFamily("vcuda_build_info", "The vcuda release this process runs",
                               labels=["version"])
    family.add_metric([VERSION], 1)
    return family


class Latency:
    """How long calls took: counts in buckets of ``bounds`` (seconds, ascending) and the sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.seconds = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self.seconds += seconds

    def buckets(self) -> list[tuple[str, int]]:
        """The cumulative counts by upper bound, as HistogramMetricFamily takes them."""
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, self._bounds), "+Inf"), self._counts):
            cumulative += count
            buckets.append((bound, cumulative))
        return buckets


class Metrics:
    """The webhook's metrics, kept as plain numbers and turned into metric families at scrape.

    A review only adds to a few numbers (no locks: the server counts from its
    event loop alone), which keeps metrics off the cost of each review.
    """

    def __init__(self, certificate_seconds_left: Callable[[], float],
                 connections_closed: Callable[[], Mapping[str, int]] = dict,
                 max_gpu_memory: Callable[[], int] | None = None) -> None:
        """Args:
            certificate_seconds_left: read at each scrape for the expiry gauge.
            connections_closed: read at each scrape: connections the server closed, by reason.
            max_gpu_memory: read at each scrape: the largest vcuda-memory admitted, in bytes.
        """
        self._connections_closed = connections_closed
        self._max_gpu_memory = max_gpu_memory
        self._reviews = dict.fromkeys(OUTCOMES, 0)
        self._latency = Latency(_LATENCY_BOUNDS)
        self._certificate_seconds_left = certificate_seconds_left
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def observe(self, outcome: str, seconds: float) -> None:
        """Count one review under ``outcome`` (see OUTCOMES) and record how long it took."""
        self._reviews[outcome] += 1
        self._latency.observe(seconds)

    def collect(self) -> Iterator[Metric]:
        """The metric families, for the registry."""
        yield build_info()
        reviews = CounterMetricFamily("vcuda_webhook_reviews",
                                      "AdmissionReviews answered, by decision",
                                      labels=["decision"])
        for decision, count in self._reviews.items():
            reviews.add_metric([decision], count)
        yield reviews
        yield HistogramMetricFamily("vcuda_webhook_review_seconds",
                                    "Time from request to answer of /mutate",
                                    buckets=self._latency.buckets(),
                                    sum_value=self._latency.seconds)
        closed = CounterMetricFamily("vcuda_webhook_connections_closed",
                                     "Connections closed by a guard (too many, too slow)",
                                     labels=["reason"])
        for reason, count in self._connections_closed().items():
            closed.add_metric([reason], count)
        yield closed
        yield GaugeMetricFamily("vcuda_webhook_certificate_expiry_seconds",
                                "Seconds until the serving certificate expires",
                                value=self._certificate_seconds_left())
        if self._max_gpu_memory is not None:
            yield GaugeMetricFamily("vcuda_webhook_max_gpu_memory_bytes",
                                    "The largest vcuda-memory admitted: the configured "
                                    "max_gpu_memory, or the largest GPU share Nodes publish",
                                    value=self._max_gpu_memory())

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
