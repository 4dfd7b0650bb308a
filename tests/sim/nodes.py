"""The simulated GPU nodes of a cluster, in processes of their own (:mod:`tests.sim.apart`), as
nodes are machines apart from the control plane: each node's agent (its placement part) and
fake kubelet, driving the device plugin over its gRPC sockets and the API server over HTTPS, as
in one process, but on a core of their own. Pods start on several nodes at once.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from tests.node.fake_kubelet import StartError
from tests.node.gpu_node import GpuNode
from tests.sim import apart

_as_text = apart.as_text(StartError)  # a refusal the simulation counts comes back as itself


class NodeHost:
    """The nodes named in ``memories`` (their GPUs' sizes), under ``root``; once they all
    advertise their devices, every agent passes every ``agent_every`` seconds. A pass that
    fails on one node is recorded (:meth:`errors`) and the others go on."""

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
        self._errors: list[str] = []
        self._stopping = threading.Event()
        self._agents = threading.Thread(target=self._pass_every_interval, daemon=True)
        self._agents.start()

    @_as_text
    def start_pod(self, node: str, pod: dict[str, Any]) -> dict[str, list[str]]:
        """Admit ``pod`` on ``node`` and start its containers: the GPU UUIDs each container
        sees, by name; StartError when kubelet or the device plugin refuses."""
        kubelet = self._nodes[node].kubelet
        metadata = pod["metadata"]
        kubelet.admit(pod)
        return {container["name"]: kubelet.start_container(metadata["namespace"],
                                                           metadata["name"], container["name"])
                for container in pod["spec"]["containers"]}

    @_as_text
    def remove_pod(self, node: str, namespace: str, name: str) -> None:
        """The pod ended on ``node``: kubelet frees its devices."""
        self._nodes[node].kubelet.remove(namespace, name)

    @_as_text
    def restart_agents(self, names: list[str]) -> None:
        for name in names:
            self._nodes[name].restart_agent()

    def pass_all(self) -> None:
        """One agent pass on every node now."""
        for name, node in self._nodes.items():
            try:
                node.agent_pass()
            except Exception:
                self._errors.append(f"agent pass on {name}: {traceback.format_exc()}")

    def errors(self) -> list[str]:
        """The agent passes that failed so far, with their tracebacks."""
        return list(self._errors)

    @_as_text
    def stop(self) -> None:
        self._stopping.set()
        self._agents.join()
        for node in self._nodes.values():
            node.stop()

    def _pass_every_interval(self) -> None:
        while not self._stopping.wait(self._every):
            self.pass_all()


apart.Manager.register("NodeHost", NodeHost)


class Nodes:
    """The nodes of several :class:`NodeHost` processes, as one: each call goes to the host
    of the node it names."""

    def __init__(self, hosts: list[tuple[Any, list[str]]]) -> None:
        """``hosts``: each host's proxy and the names of its nodes."""
        self._hosts = [host for host, _ in hosts]
        self._host_of = {name: host for host, names in hosts for name in names}

    def start_pod(self, node: str, pod: dict[str, Any]) -> dict[str, list[str]]:
        return self._host_of[node].start_pod(node, pod)

    def remove_pod(self, node: str, namespace: str, name: str) -> None:
        self._host_of[node].remove_pod(node, namespace, name)

    def restart_agents(self, names: list[str]) -> None:
        for host in self._hosts:
            host.restart_agents([name for name in names if self._host_of[name] is host])

    def pass_all(self) -> None:
        for host in self._hosts:
            host.pass_all()

    def errors(self) -> list[str]:
        return [error for host in self._hosts for error in host.errors()]


@contextmanager
def started(root: Path, kubeconfig: Path, memories: dict[str, list[int]], ledger_grace: float,
            agent_every: float, processes: int = 1) -> Iterator[tuple[Nodes, list[int]]]:
    """The nodes spread over ``processes`` processes, each with its :class:`NodeHost` ready:
    (the nodes, the processes' pids); the nodes are stopped and the processes ended
    afterwards."""
    names = list(memories)
    with ExitStack() as stack:
        hosts, pids = [], []
        for index in range(processes):
            manager, pid = stack.enter_context(apart.process(root, f"nodes-{index}"))
            share = names[index::processes]
            host = manager.NodeHost(  # type: ignore[attr-defined]
                str(root), str(kubeconfig), {name: memories[name] for name in share},
                ledger_grace, agent_every, logging.getLogger().getEffectiveLevel())
            stack.callback(host.stop)
            hosts.append((host, share))
            pids.append(pid)
        yield Nodes(hosts), pids
