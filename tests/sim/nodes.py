"""The simulated GPU nodes of a cluster, in a process of their own, as nodes are machines apart
from the control plane: each node's agent (its placement part) and fake kubelet, driving the
device plugin over its gRPC sockets and the API server over HTTPS, as in one process, but on a
core of their own.

:class:`NodeHost` runs in that process (``python -m tests.sim.nodes``, started by
:func:`started`); the simulation calls it through a :mod:`multiprocessing` manager's proxy, one
connection per calling thread, and the host answers each connection in a thread of its own, so
pods start on several nodes at once.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.managers import BaseManager
from pathlib import Path
from typing import Any

from tests.node.gpu_node import GpuNode

ROOT = Path(__file__).resolve().parents[2]
_AUTHKEY = "VCUDA_SIM_NODES_KEY"  # the environment variable that passes the manager's key


class NodeHost:
    """The nodes named in ``memories`` (their GPUs' sizes), under ``root``; once they all
    advertise their devices, every agent passes every ``agent_every`` seconds."""

    def __init__(self, root: str, kubeconfig: str, memories: dict[str, list[int]],
                 ledger_grace: float, agent_every: float, log_level: int) -> None:
        logging.basicConfig(level=log_level)
        log = logging.getLogger("placement-sim")
        self._nodes = {name: GpuNode(Path(root) / name, name, sizes, kubeconfig, log,
                                     ledger_grace=ledger_grace)
                       for name, sizes in memories.items()}
        for node in self._nodes.values():
            node.ready()
        self._every = agent_every
        self._stopping = threading.Event()
        self._agents = threading.Thread(target=self._pass_every_interval, daemon=True)
        self._agents.start()

    def start_pod(self, node: str, pod: dict[str, Any]) -> dict[str, list[str]]:
        """Admit ``pod`` on ``node`` and start its containers: the GPU UUIDs each container
        sees, by name; StartError when kubelet or the device plugin refuses."""
        kubelet = self._nodes[node].kubelet
        metadata = pod["metadata"]
        kubelet.admit(pod)
        return {container["name"]: kubelet.start_container(metadata["namespace"],
                                                           metadata["name"], container["name"])
                for container in pod["spec"]["containers"]}

    def remove_pod(self, node: str, namespace: str, name: str) -> None:
        """The pod ended on ``node``: kubelet frees its devices."""
        self._nodes[node].kubelet.remove(namespace, name)

    def restart_agents(self, names: list[str]) -> None:
        for name in names:
            self._nodes[name].restart_agent()

    def pass_all(self) -> None:
        """One agent pass on every node now."""
        for node in self._nodes.values():
            node.agent_pass()

    def stop(self) -> None:
        self._stopping.set()
        self._agents.join()
        for node in self._nodes.values():
            node.stop()

    def _pass_every_interval(self) -> None:
        while not self._stopping.wait(self._every):
            self.pass_all()


class _Manager(BaseManager):
    pass


_Manager.register("NodeHost", NodeHost)


@contextmanager
def started(root: Path, kubeconfig: Path, memories: dict[str, list[int]], ledger_grace: float,
            agent_every: float, timeout: float = 60.0) -> Iterator[tuple[Any, int]]:
    """The nodes' process with its :class:`NodeHost` ready: (the host's proxy, the process's
    pid); the nodes are stopped and the process ended afterwards."""
    address = str(root / "nodes.sock")
    key = os.urandom(16)
    process = subprocess.Popen([sys.executable, "-m", "tests.sim.nodes", address], cwd=ROOT,
                               env={**os.environ, _AUTHKEY: key.hex()})
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(address):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the simulated nodes' process did not start")
            time.sleep(0.05)
        manager = _Manager(address, key)
        manager.connect()
        host = manager.NodeHost(str(root), str(kubeconfig), memories,  # type: ignore[attr-defined]
                                ledger_grace, agent_every, logging.getLogger().getEffectiveLevel())
        try:
            yield host, process.pid
        finally:
            host.stop()
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    """Serve a :class:`NodeHost` maker on the unix socket named by the first argument."""
    manager = _Manager(sys.argv[1], bytes.fromhex(os.environ[_AUTHKEY]))
    manager.get_server().serve_forever()


if __name__ == "__main__":
    main()
