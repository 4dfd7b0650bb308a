"""One simulated GPU node for placement: vcuda's node agent (its placement part, with made-up
GPUs instead of NVML) and a fake kubelet, talking over real unix sockets in a folder."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runtime_hook.contract import ENABLED_LABEL, Gpu
from runtime_hook.node.advertise import NodeStatus
from runtime_hook.node.placement_agent import Paths, Placement
from tests.extender.cluster import CORE_KEYS, gpu_uuid
from tests.fake_cluster_api import FakeClusterApi
from tests.node.fake_kubelet import FakeKubelet


def register(api: FakeClusterApi, name: str) -> None:
    """The Node object of ``name``, as kubelet creates it when the node joins, labelled to run
    vcuda's node DaemonSet."""
    api.put(f"/api/v1/nodes/{name}", {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": name,
                                                   "labels": {ENABLED_LABEL: "true"}},
                                      "spec": {}, "status": {}})


def gpus(name: str, memories: list[int]) -> list[Gpu]:
    """The GPUs of node ``name``, of ``memories`` bytes each."""
    return [Gpu(gpu_uuid(name, i), i, memory) for i, memory in enumerate(memories)]


class GpuNode:
    """A node named ``name`` with GPUs of ``memories`` bytes, under ``root``; its Node object is
    in the API already (:func:`register`)."""

    def __init__(self, root: Path, name: str, memories: list[int], kubeconfig: str,
                 log: logging.Logger, clock: Callable[[], float] = time.time,
                 ledger_grace: float = 60.0) -> None:
        self.name = name
        self.gpus = gpus(name, memories)
        self._kubeconfig, self._log, self._clock = kubeconfig, log, clock
        self._ledger_grace = ledger_grace
        root.mkdir(parents=True, exist_ok=True)
        self.paths = Paths(str(root / "plugins"), str(root / "cdi"),
                           str(root / "pod-resources" / "kubelet.sock"))
        self.kubelet = FakeKubelet(self.paths.plugin_dir, self.paths.pod_resources,
                                   self.paths.cdi_dir, seed=hash(name) & 0xFFFF)
        self.kubelet.start()
        # One node agent process runs its passes one at a time and is gone before its
        # replacement starts: callers from several threads (a pass every interval, a restart)
        # take turns on this lock.
        self._agent_lock = threading.RLock()
        self.agent = self._new_agent()

    def _new_agent(self) -> Placement:
        return Placement(NodeStatus(self.name, self._kubeconfig), self.paths, CORE_KEYS,
                         self._log, self._clock, self._ledger_grace)

    def agent_pass(self) -> None:
        """One pass of the node agent's loop (it runs every --interval)."""
        with self._agent_lock:
            self.agent.once(self.gpus)

    def restart_agent(self) -> None:
        """The node agent's pod is replaced: a new process starts from nothing."""
        with self._agent_lock:
            self.agent.stop()
            self.agent = self._new_agent()
            self.agent_pass()

    def ready(self) -> None:
        """Publish and wait until kubelet sees the plugins' devices."""
        self.agent_pass()
        for resource, per_gpu in (("vcuda.io/shared-gpu", 100), ("vcuda.io/gpu", 1)):
            self.kubelet.wait_for_devices(resource, per_gpu * len(self.gpus))

    def stop(self) -> None:
        with self._agent_lock:
            self.agent.stop()
        self.kubelet.stop()
