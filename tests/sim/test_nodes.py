"""The simulated nodes' process: its agent passes go on past one node's error, and what goes
wrong in it comes back as text."""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_hook.contract import INVENTORY_ANNOTATION
from runtime_hook.placement import decode_inventory
from tests.extender.cluster import GIB, pod_object
from tests.extender.test_nodes import eventually
from tests.fake_cluster_api import FakeClusterApi, running
from tests.node.gpu_node import GpuNode, register
from tests.sim import apart, nodes

MEMORIES = {"gpu-0": [16 * GIB], "gpu-1": [16 * GIB]}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeClusterApi]:
    with running(tmp_path) as server:
        (tmp_path / "kubeconfig").write_text(server.kubeconfig())
        for name in MEMORIES:
            register(server, name)
        yield server


def heartbeat(api: FakeClusterApi, node: str) -> int:
    annotations = api.get(f"/api/v1/nodes/{node}")["metadata"]["annotations"]
    return decode_inventory(annotations[INVENTORY_ANNOTATION]).heartbeat


def test_agent_passes_go_on_after_one_node_fails_and_the_failures_are_reported(
        api: FakeClusterApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_pass = GpuNode.agent_pass
    failing = threading.Event()

    def agent_pass(node: GpuNode) -> None:
        if node.name == "gpu-0" and failing.is_set():
            raise ValueError("Cannot invoke RPC: Channel closed!")
        real_pass(node)

    monkeypatch.setattr(GpuNode, "agent_pass", agent_pass)
    host = nodes.NodeHost(str(tmp_path), str(tmp_path / "kubeconfig"), MEMORIES, 60.0, 0.1,
                          logging.INFO)
    try:
        failing.set()
        eventually(lambda: host.errors() != [])
        first = heartbeat(api, "gpu-1")
        # gpu-1's passes go on after gpu-0's failed, and gpu-0's are tried again.
        eventually(lambda: heartbeat(api, "gpu-1") > first and len(host.errors()) >= 2)
        error = host.errors()[0]
        assert error.startswith("agent pass on gpu-0: Traceback")
        assert "ValueError: Cannot invoke RPC: Channel closed!" in error
    finally:
        host.stop()


def test_an_error_in_a_nodes_process_comes_back_as_its_traceback(
        api: FakeClusterApi, tmp_path: Path) -> None:
    pod = pod_object("p", cores=10, memory_gib=1)
    del pod["spec"]
    with (nodes.started(tmp_path, tmp_path / "kubeconfig", MEMORIES, 60.0, 1.0,
                        processes=2) as (host, pids),
          pytest.raises(apart.PartError, match=r"(?s)Traceback.*KeyError: 'spec'")):
        assert len(set(pids)) == 2
        host.start_pod("gpu-1", pod)
    error = apart.PartError("Traceback ...")
    assert str(pickle.loads(pickle.dumps(error))) == "Traceback ..."
