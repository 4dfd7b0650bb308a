"""Simulated GPU nodes beside the real control plane, for scripts/bench-scheduling: their Node
objects and ResourceSlices as vcuda's agent publishes them, kwok's stages that keep them Ready
and run their pods, the agents' API traffic (heartbeat and ledger pruning), and the pods of a
mixed workload on each placement path.

kwok (upstream's simulator, built by scripts/build-upstream --kwok) plays each node's kubelet:
it renews the node's Lease, marks its pods Running and removes deleted ones. What vcuda's agent
would send the API server is sent with the agent's own encoders: the inventory annotation every
--interval (30 s), the ledger lines of pods that are gone pruned by the agent's own rule, and
the line of each pod that ends pruned as it ends (each agent watches its node's pods; here one
watch of the namespace stands for them).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

from runtime_hook.contract import (
    DEFAULT_DOMAINS,
    ENABLED_LABEL,
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    SHARED_RESOURCE,
    WHOLE_RESOURCE,
    Gpu,
    Sharing,
)
from runtime_hook.node.advertise import resources
from runtime_hook.node.device_plugin import slots_per_gpu
from runtime_hook.node.dra.slices import GpuModel, resource_slice
from runtime_hook.node.ended_pods import WatchEnded, ended_uid
from runtime_hook.node.placement_agent import LEDGER_GRACE, PRUNE_BATCH, ended_lines
from runtime_hook.placement import Entry, decode_ledger, encode_inventory, encode_ledger
from tests.extender.cluster import GIB, gpu_uuid, pod_object
from webhook.kube import Kube, KubeError

SIMULATED_LABEL = "vcuda-bench/simulated"  # kwok manages the nodes that carry it
NAMESPACE = "bench"
GPUS_PER_NODE = 8
# Two kinds of node, alternating: 8 GPUs of 80 GiB (H100) or of 48 GiB (L40S).
MODELS = ((80 * GIB, "NVIDIA H100 80GB HBM3", (9, 0)), (48 * GIB, "NVIDIA L40S", (8, 9)))
AGENT_INTERVAL = 30.0  # the node agent's default --interval
SHARES = ((10, 2), (20, 5), (25, 5), (30, 10), (50, 20))  # (vcuda-core, GiB) of a share
WHOLE_FRACTION = 0.2  # of the pods; a fifth of those take two GPUs

KWOK_STAGES = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: vcuda-bench-node-ready
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
      - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
        operator: NotIn
        values: ["True"]
  next:
    statusTemplate: |
      conditions:
        - type: Ready
          status: "True"
          reason: KubeletReady
          message: simulated by kwok for the scheduling benchmark
          lastHeartbeatTime: {{ Now | Quote }}
          lastTransitionTime: {{ Now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: vcuda-bench-pod-running
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
      - key: .metadata.deletionTimestamp
        operator: DoesNotExist
      - key: .status.phase
        operator: In
        values: [Pending]
  next:
    statusTemplate: |
      phase: Running
      startTime: {{ Now | Quote }}
      conditions:
        - type: Ready
          status: "True"
          lastTransitionTime: {{ Now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: vcuda-bench-pod-gone
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
      - key: .metadata.deletionTimestamp
        operator: Exists
  next:
    delete: true
"""


def node_name(index: int) -> str:
    return f"sim-{index:04d}"


def node_gpus(index: int) -> list[Gpu]:
    memory = MODELS[index % 2][0]
    return [Gpu(gpu_uuid(node_name(index), k), k, memory) for k in range(GPUS_PER_NODE)]


def node_object(index: int, now: float) -> dict[str, Any]:
    """A simulated node as it is once vcuda's agent and device plugins ran on it: labelled,
    its inventory published, its extended resources advertised."""
    gpus = node_gpus(index)
    capacity = {"cpu": "128", "memory": "1Ti", "pods": "250",
                **resources(gpus, DEFAULT_DOMAINS, Sharing()),
                SHARED_RESOURCE: str(sum(slots_per_gpu(SHARED_RESOURCE, g) for g in gpus)),
                WHOLE_RESOURCE: str(len(gpus))}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name(index),
                         "labels": {ENABLED_LABEL: "true", SIMULATED_LABEL: "true"},
                         "annotations": {INVENTORY_ANNOTATION: encode_inventory(gpus, int(now))}},
            "status": {"capacity": capacity, "allocatable": capacity}}


def node_slice(index: int, node_uid: str) -> dict[str, Any]:
    """The simulated node's ResourceSlice, as the DRA agent writes it."""
    _, product, capability = MODELS[index % 2]
    models = [GpuModel(g.uuid, g.index, g.memory, product, capability) for g in node_gpus(index)]
    return resource_slice(node_name(index), models, Sharing(), 1, node_uid)


class Pod:
    """One pod of the workload: a share (cores, GiB) or ``whole`` GPUs."""

    def __init__(self, name: str, cores: int = 0, gib: int = 0, whole: int = 0) -> None:
        self.name, self.cores, self.gib, self.whole = name, cores, gib, whole

    def template(self) -> str:
        """The ResourceClaimTemplate the DRA path's pod uses."""
        return f"bench-whole-{self.whole}" if self.whole else f"bench-{self.cores}-{self.gib}gi"

    def device_plugin_object(self, scheduler: str) -> dict[str, Any]:
        """As vcuda's webhook admits the pod on the per-GPU placement path."""
        body = pod_object(self.name, self.cores, self.gib, self.whole, NAMESPACE)
        del body["metadata"]["uid"]
        body["spec"]["schedulerName"] = scheduler
        return body

    def dra_object(self, scheduler: str) -> dict[str, Any]:
        """The same ask on the DRA path: a claim from the template of its share."""
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": self.name, "namespace": NAMESPACE},
                "spec": {"schedulerName": scheduler,
                         "containers": [{"name": "work", "image": "busybox",
                                         "resources": {"claims": [{"name": "gpu"}]}}],
                         "resourceClaims": [{"name": "gpu",
                                             "resourceClaimTemplateName": self.template()}]}}


def workload(seed: int) -> Iterator[Pod]:
    """Pods without end, the same sequence for the same seed."""
    rng = random.Random(seed)
    for number in range(1_000_000):
        name = f"p{number:06d}"
        if rng.random() < WHOLE_FRACTION:
            yield Pod(name, whole=2 if rng.random() < 0.2 else 1)
        else:
            cores, gib = rng.choice(SHARES)
            yield Pod(name, cores, gib)


def claim_templates() -> list[dict[str, Any]]:
    """A ResourceClaimTemplate for each ask of :func:`workload`."""
    found = []
    for whole in (1, 2):
        found.append(_template(f"bench-whole-{whole}", {"count": whole}))
    for cores, gib in SHARES:
        found.append(_template(f"bench-{cores}-{gib}gi", {"capacity": {"requests": {
            "cores": str(cores), "memory": f"{gib}Gi"}}}))
    return found


def _template(name: str, exactly: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.vcuda.io", **exactly}}]}}}}


class Agents:
    """What vcuda's agent on each simulated node sends the API server, spread evenly over its
    interval: the inventory with a fresh heartbeat, then the ledger pruned of pods gone; and
    between passes, the lines of pods that end pruned as they end."""

    def __init__(self, kube: Kube, nodes: int, interval: float = AGENT_INTERVAL) -> None:
        self._kube, self._nodes, self._interval = kube, nodes, interval
        self.passes = self.pruned = self.failures = 0
        self._ended: dict[str, set[str]] = {}  # by node, the UIDs of its pods that ended
        self._pruners: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        ends = asyncio.create_task(self._watch_ends())
        try:
            await self._passes()
        finally:
            ends.cancel()
            for pruner in list(self._pruners):
                pruner.cancel()

    def _ends_noted(self, node: str, uids: set[str]) -> None:
        """Note ``uids`` ended on ``node``; the first noted since its last write starts one."""
        if node not in self._ended:
            pruner = asyncio.create_task(self._prune_ended(node))
            self._pruners.add(pruner)
            pruner.add_done_callback(self._pruners.discard)
        self._ended.setdefault(node, set()).update(uids)

    async def _watch_ends(self) -> None:
        while True:
            try:
                version = (await self._kube.get(
                    f"/api/v1/namespaces/{NAMESPACE}/pods?limit=1"))["metadata"]["resourceVersion"]
                path = (f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&resourceVersion={version}"
                        "&allowWatchBookmarks=true")
                async for line in self._kube.lines(path, idle=600):
                    uid, _ = ended_uid(line)
                    node = (json.loads(line)["object"].get("spec") or {}).get("nodeName")
                    if uid is not None and node:
                        self._ends_noted(node, {uid})
            except (KubeError, WatchEnded):
                self.failures += 1
                await asyncio.sleep(1)  # as the agent pauses before it lists again

    async def _prune_ended(self, name: str) -> None:
        """The agent's pruner: the ends of a burst gathered, then one conditional write."""
        await asyncio.sleep(PRUNE_BATCH)
        ended = self._ended.pop(name)
        path = f"/api/v1/nodes/{name}"
        try:
            node = await self._kube.get(path)
            metadata = node.get("metadata") or {}
            ledger = decode_ledger((metadata.get("annotations") or {}).get(LEDGER_ANNOTATION))
            await self._write_pruned(path, metadata, ledger, [uid for uid in ledger
                                                              if uid in ended])
        except KubeError as exc:
            if exc.status != 409:
                self.failures += 1
                return
            self._ends_noted(name, ended)  # the node changed meanwhile: read it again, retry

    async def _passes(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        pending: set[asyncio.Task[None]] = set()
        for turn in range(1 << 40):
            index = turn % self._nodes
            await asyncio.sleep(max(0.0, start + turn * self._interval / self._nodes
                                    - loop.time()))
            task = asyncio.create_task(self._pass(index))
            pending.add(task)
            task.add_done_callback(pending.discard)

    async def _pass(self, index: int) -> None:
        name = node_name(index)
        path = f"/api/v1/nodes/{name}"
        try:
            await self._kube.merge_patch(path, {"metadata": {"annotations": {
                INVENTORY_ANNOTATION: encode_inventory(node_gpus(index), int(time.time()))}}})
            node = await self._kube.get(path)
            metadata = node.get("metadata") or {}
            raw = (metadata.get("annotations") or {}).get(LEDGER_ANNOTATION)
            if raw is not None:
                pods = await self._kube.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}")
                ledger = decode_ledger(raw)
                await self._write_pruned(path, metadata, ledger, ended_lines(
                    ledger, pods.get("items") or [], time.time(), LEDGER_GRACE))
        except KubeError as exc:
            if exc.status != 409:  # a conflict: the extender wrote the ledger meanwhile
                self.failures += 1
        self.passes += 1

    async def _write_pruned(self, path: str, metadata: dict[str, Any], ledger: dict[str, Entry],
                            gone: list[str]) -> None:
        """The node's ledger without the lines ``gone``, if the node is still as read."""
        if gone:
            kept = {uid: entry for uid, entry in ledger.items() if uid not in gone}
            await self._kube.merge_patch(path, {"metadata": {
                "resourceVersion": metadata.get("resourceVersion"),
                "annotations": {LEDGER_ANNOTATION: encode_ledger(kept)}}})
            self.pruned += len(gone)

