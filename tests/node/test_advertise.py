"""Advertising: the GPU inventory for the hook, and the node's extended resources through a local
HTTPS server with the API's semantics and the manifests' RBAC."""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from pathlib import Path

import pynvml
import pytest

from runtime_hook import contract
from runtime_hook.contract import MAX_GPU_MEMORY_ANNOTATION as LARGEST
from runtime_hook.contract import Gpu, Sharing
from runtime_hook.node.advertise import largest_share_change, resources, status_patch
from runtime_hook.node.agent import Advertiser, Settings, run
from runtime_hook.node.logs import setup
from runtime_hook.node.nvml import Nvml
from tests.node.conftest import KUBELETS, NODE
from tests.node.fake_nodes_api import JSON_PATCH, NODE_AGENT, FakeNodesApi
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml
from tests.node.workloads_on_host import scrape

PATH = f"/api/v1/nodes/{NODE}"


# --- what is advertised (pure) ------------------------------------------------------------------

def test_each_gpu_gives_100_cores_and_its_memory_in_256_mib_units() -> None:
    gpus = [Gpu("GPU-a", 0, 80 * GIB), Gpu("GPU-b", 1, 40 * GIB)]
    assert resources(gpus, ["docker.com"], Sharing()) == {
        "docker.com/vcuda-core": "200", "docker.com/vcuda-memory": "480"}


def test_cores_scaling_advertises_that_many_more_cores_per_gpu() -> None:
    gpus = [Gpu("GPU-a", 0, 16 * GIB), Gpu("GPU-b", 1, 16 * GIB)]
    assert resources(gpus, ["docker.com"], Sharing(cores_scaling=1.5))[
        "docker.com/vcuda-core"] == "300"


def test_memory_scaling_multiplies_and_each_gpu_is_rounded_down_on_its_own() -> None:
    # 16 GiB less a byte is 63 whole units; two of them are 126, not 127.
    gpus = [Gpu("GPU-a", 0, 16 * GIB - 1), Gpu("GPU-b", 1, 16 * GIB - 1)]
    assert resources(gpus, ["docker.com"], Sharing())["docker.com/vcuda-memory"] == "126"
    assert resources(gpus, ["docker.com"], Sharing(1.5))["docker.com/vcuda-memory"] == "190"


def test_every_domain_gets_the_full_amount_and_no_gpu_gives_zero() -> None:
    assert resources([], ["docker.com", "tencent.com"], Sharing()) == {
        "docker.com/vcuda-core": "0", "docker.com/vcuda-memory": "0",
        "tencent.com/vcuda-core": "0", "tencent.com/vcuda-memory": "0"}


def test_the_largest_share_is_the_largest_gpu_times_the_scaling_and_changes_only_when_due(
) -> None:
    gpus = [Gpu("GPU-a", 0, 80 * GIB), Gpu("GPU-b", 1, 141 * GIB)]
    assert largest_share_change({}, gpus, 1.0) == {LARGEST: str(141 * GIB)}
    assert largest_share_change({}, gpus, 0.5) == {LARGEST: str(70 * GIB + (512 << 20))}
    published = {"metadata": {"annotations": {LARGEST: str(141 * GIB)}}}
    assert largest_share_change(published, gpus, 1.0) is None
    assert largest_share_change(published, [], 1.0) == {LARGEST: None}  # no GPU: removed
    assert largest_share_change({}, [], 1.0) is None


def test_the_status_patch_adds_only_what_differs_with_escaped_pointers() -> None:
    node = {"status": {"capacity": {"docker.com/vcuda-core": "100", "cpu": "8"},
                       "allocatable": {"docker.com/vcuda-core": "200"}}}
    wanted = {"docker.com/vcuda-core": "200"}
    assert status_patch(node, wanted) == [
        {"op": "add", "path": "/status/capacity/docker.com~1vcuda-core", "value": "200"}]
    assert status_patch({"status": {"capacity": wanted, "allocatable": wanted}}, wanted) == []


def test_a_node_without_a_capacity_map_gets_one() -> None:
    assert status_patch({"status": {}}, {"docker.com/vcuda-core": "100"}) == [
        {"op": "add", "path": "/status/capacity", "value": {"docker.com/vcuda-core": "100"}},
        {"op": "add", "path": "/status/allocatable", "value": {"docker.com/vcuda-core": "100"}}]


# --- against the API ---------------------------------------------------------------------------

@pytest.fixture
def devices() -> list[FakeDevice]:
    return [FakeDevice("GPU-a", 80 * GIB), FakeDevice("GPU-b", 40 * GIB)]


def _settings(tmp_path: Path, kubeconfig: str, **changes: object) -> Settings:
    base = Settings(host_root=str(tmp_path / "host"), state_dir="/run/vcuda", node=NODE,
                    domains=("docker.com", "tencent.com"), sharing=Sharing(),
                    address="127.0.0.1", port=0, interval=1.0, run_dirs=[], advertise=True,
                    kubeconfig=kubeconfig, placement=False)
    return base._replace(**changes)


def _advertiser(tmp_path: Path, kubeconfig: str, devices: list[FakeDevice],
                **changes: object) -> Advertiser:
    from runtime_hook.node.advertise import NodeStatus

    settings = _settings(tmp_path, kubeconfig, **changes)
    return Advertiser(Nvml(FakeNvml(devices)), settings, NodeStatus(NODE, kubeconfig),
                      logging.getLogger("vcuda-node"))


def _vcuda(api: FakeNodesApi, field: str = "capacity") -> dict[str, str]:
    node = api.get(PATH)
    assert node is not None
    return {k: v for k, v in node["status"][field].items() if "vcuda" in k}


WANTED = {"docker.com/vcuda-core": "200", "docker.com/vcuda-memory": "480",
          "tencent.com/vcuda-core": "200", "tencent.com/vcuda-memory": "480"}


def test_the_node_gets_its_resources_in_capacity_and_allocatable_by_one_json_patch(
    api: FakeNodesApi, kubeconfig: str, devices: list[FakeDevice], tmp_path: Path
) -> None:
    _advertiser(tmp_path, kubeconfig, devices).once()
    assert _vcuda(api, "capacity") == _vcuda(api, "allocatable") == WANTED
    node = api.get(PATH)
    assert node is not None and node["status"]["capacity"]["cpu"] == "64"  # the kubelet's stay
    [patch] = [r for r in api.requests if r.method == "PATCH" and r.path.endswith("/status")]
    assert (patch.path, patch.content_type, patch.status) == (f"{PATH}/status", JSON_PATCH, 200)
    paths = {op["path"] for op in json.loads(patch.body)}
    assert "/status/capacity/docker.com~1vcuda-core" in paths and len(paths) == 8


def test_the_node_publishes_its_largest_share_for_the_webhook(
    api: FakeNodesApi, kubeconfig: str, devices: list[FakeDevice], tmp_path: Path
) -> None:
    advertiser = _advertiser(tmp_path, kubeconfig, devices, sharing=Sharing(1.5))
    advertiser.once()
    node = api.get(PATH)
    assert node is not None and node["metadata"]["annotations"] == {LARGEST: str(120 * GIB)}
    assert node["status"]["capacity"]["cpu"] == "64"
    devices.clear()  # the driver lost every GPU: the node offers no share at all
    advertiser.once()
    node = api.get(PATH)
    assert node is not None and LARGEST not in node["metadata"].get("annotations", {})


def test_an_unchanged_node_is_only_read(api: FakeNodesApi, kubeconfig: str,
                                        devices: list[FakeDevice], tmp_path: Path) -> None:
    advertiser = _advertiser(tmp_path, kubeconfig, devices)
    advertiser.once()
    api.requests.clear()
    advertiser.once()
    assert [r.method for r in api.requests] == ["GET"]


def test_resources_are_advertised_again_when_the_gpus_or_the_node_change(
    api: FakeNodesApi, kubeconfig: str, devices: list[FakeDevice], tmp_path: Path
) -> None:
    advertiser = _advertiser(tmp_path, kubeconfig, devices)
    advertiser.once()
    devices.pop()  # a GPU is gone
    advertiser.once()
    assert _vcuda(api)["docker.com/vcuda-memory"] == "320"
    api.add_node(NODE, KUBELETS)  # the node object was recreated: no vcuda resources
    advertiser.once()
    assert _vcuda(api)["docker.com/vcuda-core"] == "100"


def test_the_inventory_is_written_for_the_hook_and_only_rewritten_when_gpus_change(
    api: FakeNodesApi, kubeconfig: str, devices: list[FakeDevice], tmp_path: Path
) -> None:
    advertiser = _advertiser(tmp_path, kubeconfig, devices)
    advertiser.once()
    path = tmp_path / "host" / "run" / "vcuda" / "gpus.json"
    assert advertiser.inventory == str(path)
    assert contract.read_inventory(str(path)) == {"GPU-a": Gpu("GPU-a", 0, 80 * GIB),
                                             "GPU-b": Gpu("GPU-b", 1, 40 * GIB)}
    inode = path.stat().st_ino
    advertiser.once()
    assert path.stat().st_ino == inode
    devices[1].memory_total = 48 * GIB
    advertiser.once()
    assert path.stat().st_ino != inode
    assert contract.read_inventory(str(path))["GPU-b"].memory == 48 * GIB  # type: ignore[index]


def test_the_inventory_lists_the_mig_devices_of_a_gpu_in_mig_mode_before_it(
    api: FakeNodesApi, kubeconfig: str, tmp_path: Path
) -> None:
    # The hook finds a MIG device the device plugin gives by its UUID; the resources
    # advertised still count whole GPUs.
    mig = "MIG-7f1e2d3c-0000-4000-8000-00000000000c"
    devices = [FakeDevice("GPU-a", 80 * GIB, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
                          migs=[FakeDevice(mig, 20 * GIB)]), FakeDevice("GPU-b", 40 * GIB)]
    advertiser = _advertiser(tmp_path, kubeconfig, devices)
    advertiser.once()
    written = json.loads(Path(advertiser.inventory).read_text())["gpus"]
    assert [(g["uuid"], g["index"], g["memory"]) for g in written] == [
        (mig, 0, 20 * GIB), ("GPU-a", 0, 80 * GIB), ("GPU-b", 1, 40 * GIB)]
    assert _vcuda(api)["docker.com/vcuda-memory"] == "480"


def test_a_damaged_inventory_is_replaced(api: FakeNodesApi, kubeconfig: str,
                                         devices: list[FakeDevice], tmp_path: Path) -> None:
    advertiser = _advertiser(tmp_path, kubeconfig, devices)
    os.makedirs(os.path.dirname(advertiser.inventory))
    Path(advertiser.inventory).write_text("{half a file")
    advertiser.once()
    assert set(contract.read_inventory(advertiser.inventory) or {}) == {"GPU-a", "GPU-b"}


def _skipped(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]
    return {e["what"]: e["reason"] for e in lines if e["event"] == "skipped"}


@pytest.fixture
def logs(capsys: pytest.CaptureFixture[str]) -> pytest.CaptureFixture[str]:
    setup("info")
    return capsys


def test_without_nvml_neither_the_inventory_nor_the_node_is_touched(
    api: FakeNodesApi, kubeconfig: str, tmp_path: Path, logs: pytest.CaptureFixture[str]
) -> None:
    from runtime_hook.node.advertise import NodeStatus

    lib = FakeNvml([FakeDevice("GPU-a")], driver_loaded=False)
    advertiser = Advertiser(Nvml(lib), _settings(tmp_path, kubeconfig),
                            NodeStatus(NODE, kubeconfig), logging.getLogger("vcuda-node"))
    advertiser.once()
    assert not os.path.exists(advertiser.inventory)
    assert api.requests == []
    assert _skipped(logs) == {
        "NVML": "NVML cannot start: the NVIDIA driver is not loaded (NVML error 9)"}


def test_a_missing_permission_is_logged_with_the_rbac_fix_and_the_agent_goes_on(
    api: FakeNodesApi, kubeconfig: str, devices: list[FakeDevice], tmp_path: Path,
    logs: pytest.CaptureFixture[str],
) -> None:
    api.rules = [r for r in api.rules or [] if "nodes/status" not in r.resources]
    advertiser = _advertiser(tmp_path, kubeconfig, devices)
    advertiser.once()
    reason = _skipped(logs)[f"node {NODE}"]
    assert reason.startswith(f"not allowed to patch nodes/status '{NODE}': nodes/status "
                             f'"{NODE}" is forbidden: User "{NODE_AGENT}" cannot patch')
    assert reason.endswith("grant it with manifests/base/node-rbac.yaml (get and patch nodes, "
                           "patch nodes/status) and, with --placement, "
                           "manifests/placement/component/node-rbac.yaml (get and list pods)")
    assert os.path.exists(advertiser.inventory)  # the hook still gets its inventory


def test_a_wrong_node_name_and_a_rejected_token_are_named(
    api: FakeNodesApi, devices: list[FakeDevice], tmp_path: Path,
    logs: pytest.CaptureFixture[str],
) -> None:
    wrong = tmp_path / "wrong-token"
    wrong.write_text(api.kubeconfig(token="not-the-token"))
    _advertiser(tmp_path, str(wrong), devices).once()
    assert _skipped(logs)[f"node {NODE}"] == f"cannot get nodes '{NODE}': HTTP 401: Unauthorized"
    api.objects.clear()
    good = tmp_path / "kubeconfig"
    good.write_text(api.kubeconfig())
    _advertiser(tmp_path, str(good), devices).once()
    assert _skipped(logs)[f"node {NODE}"] == (
        f"node '{NODE}' does not exist: check --node-name (the DaemonSet sets it from "
        "spec.nodeName)")


class _Serving(logging.Handler):
    """Catches the port of the agent's "serving" event."""

    def __init__(self) -> None:
        super().__init__()
        self._ports: queue.Queue[int] = queue.Queue()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "serving":
            self._ports.put(record.fields["port"])  # type: ignore[attr-defined]

    def port(self, timeout: float) -> int | None:
        try:
            return self._ports.get(timeout=timeout)
        except queue.Empty:
            return None


def test_the_agent_advertises_and_serves_until_stopped(
    api: FakeNodesApi, kubeconfig: str, devices: list[FakeDevice], tmp_path: Path,
    logs: pytest.CaptureFixture[str],
) -> None:
    stop = threading.Event()
    log = logging.getLogger("vcuda-node")
    # Read from the logger itself: reading captured stderr while the agent
    # writes to it can drop a line.
    serving = _Serving()
    log.addHandler(serving)
    agent = threading.Thread(target=run, args=(_settings(tmp_path, kubeconfig), log, stop,
                                               Nvml(FakeNvml(devices))))
    agent.start()
    deadline = time.monotonic() + 30
    try:
        port = serving.port(timeout=30)
        assert port is not None
        series = scrape(port)
        assert set(series["vcuda_gpu_memory_total_bytes"].values()) == {80 * GIB, 40 * GIB}
        while _vcuda(api) != WANTED and time.monotonic() < deadline:
            stop.wait(0.05)
        assert _vcuda(api) == WANTED
    finally:
        stop.set()
        agent.join(timeout=30)
        log.removeHandler(serving)
    assert not agent.is_alive()
