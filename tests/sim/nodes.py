"""The simulated GPU nodes of a cluster, in a process of their own, as nodes are machines apart
from the control plane: each node's agent (its placement part) and fake kubelet, driving the
device plugin over its gRPC sockets and the API server over HTTPS, as in one process, but on a
core of their own.

:class:`NodeHost` runs in that process (started by :func:`started`); the simulation calls it
through a :mod:`multiprocessing` manager's proxy, one connection per calling thread, and the
host answers each connection in a thread of its own, so pods start on several nodes at once.
What goes wrong in that process comes back as text (:class:`NodeError`), as some of its
exceptions (gRPC's) cannot be pickled.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.managers import BaseManager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from tests.node.fake_kubelet import StartError
from tests.node.gpu_node import GpuNode

ROOT = Path(__file__).resolve().parents[2]
_AUTHKEY = "VCUDA_SIM_NODES_KEY"  # the environment variable that passes the manager's key
_P = ParamSpec("_P")
_R = TypeVar("_R")


class NodeError(RuntimeError):
    """An error in the nodes' process, with its traceback as text."""


def _as_text(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """``method`` raising :class:`NodeError` instead of any exception but StartError (a
    refusal the simulation counts)."""
    @functools.wraps(method)
    def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except StartError:
            raise
        except Exception:
            raise NodeError(traceback.format_exc()) from None
    return wrapped


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
    # Not "-m tests.sim.nodes": the classes must pickle by this module's name, not __main__'s.
    process = subprocess.Popen([sys.executable, "-c", "from tests.sim.nodes import main; main()",
                                address], cwd=ROOT,
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
