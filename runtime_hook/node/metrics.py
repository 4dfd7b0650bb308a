"""The agent's Prometheus endpoint: gauges of each container, each GPU and (with ``--dra``) the
claims of each GPU, built at every scrape, and the release it runs."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime_hook.contract import VERSION
from runtime_hook.node import http_serving
from runtime_hook.node.logs import Problems, event
from runtime_hook.node.observe import Observer, Snapshot

if TYPE_CHECKING:
    from runtime_hook.node.dra.driver import ClaimStats

CONTAINER_LABELS = ("namespace", "pod", "container", "node", "gpu", "uuid")
GPU_LABELS = ("node", "gpu", "uuid")

_CONTAINER = {
    "memory_limit_bytes": "GPU memory the container may use on this GPU.",
    "memory_used_bytes": "GPU memory the container's processes hold on this GPU, as the "
    "shim's shared account says (written inside the container: its own report).",
    "memory_in_host_bytes": "Of memory_used_bytes, the container's virtual memory that lives "
    "in host memory (its device-resident bytes are the difference).",
    "memory_driver_bytes": "GPU memory the container's processes hold on this GPU, as the "
    "driver accounts it per process (NVML; CUDA contexts included; beyond the container's "
    "reach).",
    "unaccounted_processes": "Processes of the container that hold memory on this GPU, "
    "per the driver, with no slot in its account (they bypassed the shim, or the "
    "account was rewritten).",
    "core_limit_ratio": "Share of this GPU's compute the container may use (vcuda-core / 100).",
    "core_used_ratio": "Share of this GPU's compute the container's processes use now "
    "(NVML per-process SM utilization, summed).",
    "processes": "Processes of the container that hold memory on this GPU.",
}
_GPU = {
    "memory_total_bytes": "The GPU's memory.",
    "memory_used_bytes": "Memory in use on the GPU, by any process (NVML).",
    "memory_limit_bytes": "Sum of the memory limits of the limited containers on the GPU "
    "(the node ledger's records).",
    "core_used_ratio": "Share of time the GPU was busy (NVML utilization).",
    "core_limit_ratio": "Sum of the compute limits of the limited containers on the GPU.",
    "containers": "Limited containers on the GPU.",
}
_GPU_SUMS = ("memory_limit_bytes", "core_limit_ratio", "containers")  # over its containers


def families(snapshot: Snapshot, node: str, errors: Counter[str],
             claims: ClaimStats | None = None) -> list[Metric]:
    """The metric families of ``snapshot`` on ``node``, with ``errors`` counted by source,
    and the DRA plugin's ``claims`` when it runs."""
    per_container = {
        key: GaugeMetricFamily(f"vcuda_container_{key}", text, labels=CONTAINER_LABELS)
        for key, text in _CONTAINER.items()
    }
    per_gpu = {
        key: GaugeMetricFamily(f"vcuda_gpu_{key}", text, labels=GPU_LABELS)
        for key, text in _GPU.items()
    }
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for gpu in snapshot.gpus:
        labels = [node, str(gpu.index), gpu.uuid]
        per_gpu["memory_total_bytes"].add_metric(labels, gpu.memory_total)
        per_gpu["memory_used_bytes"].add_metric(labels, gpu.memory_used)
        if gpu.utilization is not None:
            per_gpu["core_used_ratio"].add_metric(labels, gpu.utilization / 100)
        totals[(str(gpu.index), gpu.uuid)] = dict.fromkeys(_GPU_SUMS, 0.0)
    for usage in snapshot.usages:
        workload, index = usage.workload, "" if usage.index is None else str(usage.index)
        labels = [workload.namespace, workload.pod, workload.container, node, index, usage.uuid]
        values = {
            "memory_limit_bytes": workload.memory,
            "memory_used_bytes": usage.memory_used,
            "memory_in_host_bytes": usage.memory_in_host,
            "core_limit_ratio": workload.cores / 100,
            "core_used_ratio": usage.core_used,
            "processes": usage.processes,
            "memory_driver_bytes": usage.memory_driver,
            "unaccounted_processes": usage.unaccounted,
        }
        for key, value in values.items():
            if value is not None:
                per_container[key].add_metric(labels, value)
        if workload.user is not None:
            continue  # a vcuda-run command's limits are its user's word: not the node's
        total = totals.setdefault((index, usage.uuid), dict.fromkeys(_GPU_SUMS, 0.0))
        total["memory_limit_bytes"] += workload.memory
        total["core_limit_ratio"] += workload.cores / 100
        total["containers"] += 1
    for (index, uuid), total in totals.items():
        for key in _GPU_SUMS:
            per_gpu[key].add_metric([node, index, uuid], total[key])
    failures = CounterMetricFamily(
        "vcuda_node_collect_errors",
        "Data the agent had to skip (see its log), by source.",
        labels=["source"],
    )
    for source, count in sorted(errors.items()):
        failures.add_metric([source], count)
    refused = CounterMetricFamily(
        "vcuda_node_refused_starts",
        "Container starts the hook refused on this node since its state dir was made (on /run: "
        "since boot); the reasons are in the pods' events and the hook's log.",
        labels=["node"])
    if snapshot.refused_starts is not None:
        refused.add_metric([node], snapshot.refused_starts)
    found = [*per_container.values(), *per_gpu.values(), failures, refused]
    return found if claims is None else [*found, *_claim_families(snapshot, node, claims)]


def _claim_families(snapshot: Snapshot, node: str, claims: ClaimStats) -> list[Metric]:
    prepared = GaugeMetricFamily(
        "vcuda_dra_prepared_claims",
        "DRA claims prepared on this GPU by vcuda's kubelet plugin (the node ledger's records).",
        labels=GPU_LABELS)
    seen = set()
    for gpu in snapshot.gpus:
        prepared.add_metric([node, str(gpu.index), gpu.uuid], claims.prepared.get(gpu.uuid, 0))
        seen.add(gpu.uuid)
    for uuid, count in sorted(claims.prepared.items()):
        if uuid not in seen:  # a GPU NVML does not read now
            prepared.add_metric([node, "", uuid], count)
    failed = CounterMetricFamily(
        "vcuda_dra_claim_failures",
        "Claims that kubelet asked vcuda's plugin to prepare or unprepare and that failed "
        "(the reason is in the agent's log and the pod's events), by call.",
        labels=["node", "call"])
    for call, count in claims.failed.items():
        failed.add_metric([node, call], count)
    return [prepared, failed]


def _build_info() -> GaugeMetricFamily:
    # As the webhook's and the extender's (webhook.metrics, which the agent does not import).
    family = GaugeMetricFamily("vcuda_build_info", "The vcuda release this process runs",
                               labels=["version"])
    family.add_metric([VERSION], 1)
    return family


class NodeCollector(Collector):
    """Takes a snapshot at each scrape; one scrape at a time. ``claims`` reads the DRA
    plugin's claims (None: the agent runs without ``--dra``)."""

    def __init__(self, observer: Observer, node: str, problems: Problems,
                 claims: Callable[[], ClaimStats] | None = None) -> None:
        self._observer = observer
        self._node = node
        self._problems = problems
        self._claims = claims
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            claims = None
            if self._claims is not None:  # first: the snapshot ends the problems' cycle
                try:
                    claims = self._claims()
                except OSError as exc:  # the ledger cannot be read: the rest still answers
                    self._problems.report("dra", "node ledger", f"claims unreadable: {exc}")
            try:
                snapshot = self._observer.snapshot()
            except Exception as exc:  # a scrape must still be answered
                event(self._problems.log, logging.ERROR, "snapshot_failed", error=repr(exc))
                self._problems.counts["agent"] += 1
                snapshot = Snapshot([], [])
            yield from families(snapshot, self._node, self._problems.counts, claims)
            yield _build_info()


def serve(collector: NodeCollector, address: str, port: int,
          limits: http_serving.Limits | None = None) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``collector`` on http://address:port/metrics in a thread, within ``limits`` of
    connections and time; return (server, thread)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return http_serving.serve(make_wsgi_app(registry), address, port, limits)
