"""`vcuda-node uninstall --node-name` takes vcuda's resources and annotations off its Node,
through a local HTTPS server with the API's semantics and the node agent's RBAC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_hook.contract import (
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    MAX_GPU_MEMORY_ANNOTATION,
)
from runtime_hook.node.cli import main
from runtime_hook.node.node_cleanup import status_removal
from tests.node.conftest import agent_api
from tests.node.fake_nodes_api import FakeNodesApi

NODE = "gpu-node-1"
PATH = f"/api/v1/nodes/{NODE}"
KUBELETS = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "vcuda.io/shared-gpu": "800"}
ADVERTISED = {"docker.com/vcuda-core": "800", "docker.com/vcuda-memory": "2240",
              "tencent.com/vcuda-core": "800", "tencent.com/vcuda-memory": "2240"}
VCUDA_ANNOTATIONS = {MAX_GPU_MEMORY_ANNOTATION: "150323855360", INVENTORY_ANNOTATION: "{}",
                     LEDGER_ANNOTATION: "{}"}
OTHERS = {"node.alpha.kubernetes.io/ttl": "0", "example.com/vcuda-note": "kept"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeNodesApi]:
    server = agent_api(tmp_path)
    server.add_node(NODE, KUBELETS | ADVERTISED, annotations=VCUDA_ANNOTATIONS | OTHERS)
    yield server
    server.stop()


def _uninstall(api: FakeNodesApi, tmp_path: Path, *flags: str) -> int:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig())
    (tmp_path / "host").mkdir(exist_ok=True)
    return main(["uninstall", "--host-root", str(tmp_path / "host"), "--kubeconfig",
                 str(kubeconfig), *flags])


def test_uninstall_takes_vcudas_resources_and_annotations_off_the_node_and_nothing_else(
    api: FakeNodesApi, tmp_path: Path
) -> None:
    assert _uninstall(api, tmp_path, "--node-name", NODE) == 0
    node = api.get(PATH)
    assert node is not None
    assert node["status"]["capacity"] == KUBELETS  # the kubelet's own, device plugins' included
    assert node["status"]["allocatable"] == KUBELETS
    assert node["metadata"]["annotations"] == OTHERS


def test_uninstall_on_a_clean_node_changes_nothing(api: FakeNodesApi, tmp_path: Path) -> None:
    assert _uninstall(api, tmp_path, "--node-name", NODE) == 0
    version = api.get(PATH)["metadata"]["resourceVersion"]  # type: ignore[index]
    assert _uninstall(api, tmp_path, "--node-name", NODE) == 0
    assert api.get(PATH)["metadata"]["resourceVersion"] == version  # type: ignore[index]


def test_uninstall_without_a_node_name_leaves_the_node_alone(
    api: FakeNodesApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    before = api.get(PATH)
    assert _uninstall(api, tmp_path) == 0
    assert api.get(PATH) == before


def test_uninstall_says_what_the_node_agents_rbac_lacks(
    api: FakeNodesApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.rules = [r for r in api.rules or [] if "nodes/status" not in r.resources]
    assert _uninstall(api, tmp_path, "--node-name", NODE) == 1
    error = capsys.readouterr().err
    assert "not allowed to patch nodes/status 'gpu-node-1'" in error
    assert "manifests/base/node-rbac.yaml" in error


def test_a_status_changed_since_it_was_read_fails_the_removal_instead_of_losing_a_write() -> None:
    node = {"status": {"capacity": {"docker.com/vcuda-core": "100"}}}
    assert status_removal(node) == [
        {"op": "test", "path": "/status/capacity/docker.com~1vcuda-core", "value": "100"},
        {"op": "remove", "path": "/status/capacity/docker.com~1vcuda-core"}]
