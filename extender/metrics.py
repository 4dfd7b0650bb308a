"""Prometheus metrics of the extender: calls by verb and outcome, their latency, bind conflicts
redone, and nodes left out because they are not vcuda nodes or their vcuda inventory is
missing, unreadable or stale; and the release, as the webhook's."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from extender.policy import NODE_CAUSES
from webhook.metrics import Latency, build_info

VERBS = ("filter", "prioritize", "bind")
# ok: answered; refused: a bind that could not be done (the scheduler retries the pod);
# bad_request: a 400 (malformed arguments, a body too large).
OUTCOMES = ("ok", "refused", "bad_request")
WRITES = ("ledger", "binding")  # the conditional writes of bind that can meet a conflict
_LATENCY_BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class Metrics:
    """Plain numbers, turned into metric families at scrape (one event loop counts: no locks)."""

    def __init__(self) -> None:
        self._calls = {(verb, outcome): 0 for verb in VERBS for outcome in OUTCOMES}
        self._latency = {verb: Latency(_LATENCY_BOUNDS) for verb in VERBS}
        self._conflicts = dict.fromkeys(WRITES, 0)
        self._left_out = dict.fromkeys(NODE_CAUSES, 0)
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        """Count one call of ``verb`` (VERBS) with ``outcome`` (OUTCOMES) that took ``seconds``."""
        self._calls[verb, outcome] += 1
        self._latency[verb].observe(seconds)

    def conflict(self, write: str) -> None:
        """A conditional ``write`` (WRITES) found its object moved on and is redone."""
        self._conflicts[write] += 1

    def left_out(self, cause: str) -> None:
        """Filter left a node out for ``cause`` (NODE_CAUSES)."""
        self._left_out[cause] += 1

    def collect(self) -> Iterator[Metric]:
        """The metric families, for the registry."""
        yield build_info()
        yield _counter("vcuda_extender_requests", "Extender calls answered, by verb and outcome",
                       ["verb", "outcome"], self._calls)
        latency = HistogramMetricFamily("vcuda_extender_request_seconds",
                                        "Time from request to answer, by verb", labels=["verb"])
        for verb, observed in self._latency.items():
            latency.add_metric([verb], observed.buckets(), observed.seconds)
        yield latency
        yield _counter(
            "vcuda_extender_bind_conflicts",
            "Conditional writes of bind that found the object changed and were redone (ledger: "
            "the node's GPU ledger; binding: the pod)", ["write"], self._conflicts)
        yield _counter(
            "vcuda_extender_nodes_left_out",
            "Nodes filter left out whatever the pod, by cause (stale_inventory: the node agent "
            "stopped publishing; not_vcuda_node: not labelled vcuda.io/enabled=true)", ["cause"],
            self._left_out)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


def _counter(name: str, documentation: str, labels: list[str],
             counts: Mapping[Any, int]) -> CounterMetricFamily:
    """A counter family with one sample per key of ``counts`` (a label value, or a tuple of
    them in the order of ``labels``)."""
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, count in counts.items():
        family.add_metric(list(key) if isinstance(key, tuple) else [key], count)
    return family
