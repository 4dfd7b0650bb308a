"""The node agent's Events on its Node: what it records, how repeats are counted, and that an
Event the API refuses never fails the agent; against the fake API server with the manifests'
RBAC."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runtime_hook.contract import Sharing
from runtime_hook.node.advertise import NodeStatus
from runtime_hook.node.agent import Advertiser, Settings
from runtime_hook.node.kube_events import CONTROLLER, NORMAL, WARNING, EventRecorder
from runtime_hook.node.nvml import Nvml
from runtime_hook.node_state import StateDir
from tests.node.conftest import NODE
from tests.node.fake_nodes_api import FakeNodesApi
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml
from tests.node.nodes import Node

NAMESPACE = "default"  # the API takes Events about a Node there or in kube-system alone
REGARDING = {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def _recorder(kubeconfig: str, clock: Clock, log: logging.Logger | None = None,
              namespace: str = NAMESPACE) -> EventRecorder:
    return EventRecorder(NodeStatus(NODE, kubeconfig).client, NODE,
                         log or logging.getLogger("vcuda-node"), clock, 60.0, namespace)


def test_the_first_occurrence_creates_an_event_on_the_node_with_its_reason_and_note(
    api: FakeNodesApi, kubeconfig: str
) -> None:
    _recorder(kubeconfig, Clock()).node_event(NORMAL, "GPUInventoryChanged", "WriteInventory",
                                              "two GPUs")
    [stored] = api.events()
    assert stored["metadata"]["namespace"] == NAMESPACE
    assert stored["metadata"]["name"].startswith(f"{NODE}.")
    assert (stored["type"], stored["reason"], stored["action"], stored["note"]) == (
        "Normal", "GPUInventoryChanged", "WriteInventory", "two GPUs")
    assert stored["regarding"] == REGARDING
    assert stored["reportingController"] == CONTROLLER
    assert stored["reportingInstance"] == f"{CONTROLLER}-{NODE}"
    assert stored["eventTime"] == "2030-03-17T17:46:40.000000Z" and "series" not in stored


def test_repeats_are_one_event_whose_series_count_is_written_at_most_once_a_minute(
    api: FakeNodesApi, kubeconfig: str
) -> None:
    clock = Clock()
    recorder = _recorder(kubeconfig, clock)
    for _ in range(5):  # one a cycle, within the minute: counted, not written
        recorder.node_event(WARNING, "ContainerStartRefused", "RefuseStart", "refused")
        clock.now += 10
    [stored] = api.events()
    assert "series" not in stored
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert patches == []
    clock.now += 20  # 70 s after the first: the next cycle writes the count
    recorder.flush()
    [stored] = api.events()
    assert stored["series"] == {"count": 5, "lastObservedTime": "2030-03-17T17:47:20.000000Z"}
    recorder.flush()  # nothing new: nothing written
    assert len([r for r in api.requests if r.method == "PATCH"]) == 1


def test_several_occurrences_at_once_start_the_series_with_their_count(
    api: FakeNodesApi, kubeconfig: str
) -> None:
    _recorder(kubeconfig, Clock()).node_event(WARNING, "ContainerStartRefused", "RefuseStart",
                                              "refused", occurrences=3)
    [stored] = api.events()
    assert stored["series"]["count"] == 3


def test_a_long_note_and_node_name_are_cut_to_what_the_api_takes(
    api: FakeNodesApi, kubeconfig: str
) -> None:
    node = "n" * 250
    recorder = EventRecorder(NodeStatus(NODE, kubeconfig).client, node,
                             logging.getLogger("vcuda-node"), Clock(), 60.0, NAMESPACE)
    recorder.node_event(NORMAL, "VcudaInstalled", "Install", "é" * 600)  # 1200 bytes
    [stored] = api.events()
    assert stored["note"] == "é" * 512
    assert len(stored["metadata"]["name"]) <= 253 and len(stored["reportingInstance"]) == 128


def test_another_note_is_another_event(api: FakeNodesApi, kubeconfig: str) -> None:
    recorder = _recorder(kubeconfig, Clock())
    recorder.node_event(NORMAL, "GPUInventoryChanged", "WriteInventory", "two GPUs")
    recorder.node_event(NORMAL, "GPUInventoryChanged", "WriteInventory", "one GPU")
    assert [e["note"] for e in api.events()] == ["two GPUs", "one GPU"]


def test_an_expired_event_is_created_anew(api: FakeNodesApi, kubeconfig: str) -> None:
    clock = Clock()
    recorder = _recorder(kubeconfig, clock)
    recorder.node_event(WARNING, "ContainerStartRefused", "RefuseStart", "refused")
    with api.lock:  # the API keeps Events an hour
        for path in [p for p in api.objects if "/events/" in p]:
            api.store(path, None)
    clock.now += 61
    recorder.node_event(WARNING, "ContainerStartRefused", "RefuseStart", "refused")  # 404
    recorder.node_event(WARNING, "ContainerStartRefused", "RefuseStart", "refused")
    [stored] = api.events()
    assert stored["reason"] == "ContainerStartRefused" and "series" not in stored


def test_an_event_about_the_node_is_refused_outside_default_and_kube_system(
    api: FakeNodesApi, kubeconfig: str, caplog: pytest.LogCaptureFixture
) -> None:
    api.rules = None  # allowed everywhere: the API's validation still refuses it
    with caplog.at_level(logging.WARNING):
        _recorder(kubeconfig, Clock(), namespace="vcuda-system").node_event(
            NORMAL, "GPUInventoryChanged", "WriteInventory", "two GPUs")
    assert api.events() == []
    [record] = caplog.records
    assert record.fields["status"] == 422  # type: ignore[attr-defined]


def test_an_event_the_api_forbids_is_logged_with_the_fix_and_the_caller_goes_on(
    api: FakeNodesApi, kubeconfig: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = _recorder(kubeconfig, Clock(), namespace="kube-system")  # not the Role's
    with caplog.at_level(logging.WARNING):
        recorder.node_event(NORMAL, "GPUInventoryChanged", "WriteInventory", "two GPUs")
    assert api.events() == []
    [record] = caplog.records
    line = record.fields  # type: ignore[attr-defined]
    assert record.getMessage() == "event_not_recorded" and line["status"] == 403
    assert "manifests/base/node-rbac.yaml" in line["fix"]


def test_an_unreachable_api_costs_a_log_line_not_the_agent(
    api: FakeNodesApi, kubeconfig: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = _recorder(kubeconfig, Clock())
    api.stop()
    with caplog.at_level(logging.WARNING):
        recorder.node_event(NORMAL, "GPUInventoryChanged", "WriteInventory", "two GPUs")
    assert [r.getMessage() for r in caplog.records if r.name == "vcuda-node"] == [
        "event_not_recorded"]


# --- what the agent records --------------------------------------------------------------------

def _advertiser(tmp_path: Path, kubeconfig: str, devices: list[FakeDevice],
                clock: Clock, driver_loaded: bool = True) -> Advertiser:
    settings = Settings(host_root=str(tmp_path / "host"), state_dir="/run/vcuda", node=NODE,
                        domains=("docker.com",), sharing=Sharing(), address="127.0.0.1",
                        port=0, interval=1.0, run_dirs=[], advertise=True,
                        kubeconfig=kubeconfig)
    log = logging.getLogger("vcuda-node")
    return Advertiser(Nvml(FakeNvml(devices, driver_loaded)), settings,
                      NodeStatus(NODE, kubeconfig), log, events=_recorder(kubeconfig, clock, log))


def test_the_agent_tells_the_node_when_its_gpus_change_and_not_when_they_stay(
    api: FakeNodesApi, kubeconfig: str, tmp_path: Path
) -> None:
    devices = [FakeDevice("GPU-a", 80 * GIB), FakeDevice("GPU-b", 40 * GIB)]
    advertiser = _advertiser(tmp_path, kubeconfig, devices, Clock())
    advertiser.once()
    advertiser.once()
    devices.pop()
    advertiser.once()
    assert [(e["reason"], e["note"], e["regarding"]["name"]) for e in api.events()] == [
        ("GPUInventoryChanged", "the GPUs the hook may give containers are now 2: "
         "0: GPU-a (80.0 GiB), 1: GPU-b (40.0 GiB)", NODE),
        ("GPUInventoryChanged", "the GPUs the hook may give containers are now 1: "
         "0: GPU-a (80.0 GiB)", NODE)]


def test_nvml_failing_every_pass_is_one_warning_counted_in_its_series(
    api: FakeNodesApi, kubeconfig: str, tmp_path: Path
) -> None:
    clock = Clock()
    advertiser = _advertiser(tmp_path, kubeconfig, [], clock, driver_loaded=False)
    for _ in range(3):
        advertiser.once()
        clock.now += 30
    [failing] = api.events()
    assert (failing["type"], failing["reason"], failing["regarding"]) == (
        "Warning", "NVMLUnavailable", REGARDING)
    assert failing["note"].endswith("; the node keeps its last GPUs advertised")
    assert failing["series"]["count"] == 3


def test_starts_the_hook_refused_since_the_last_pass_are_one_warning_with_their_count(
    api: FakeNodesApi, kubeconfig: str, tmp_path: Path
) -> None:
    state = StateDir(str(tmp_path / "host" / "run" / "vcuda"))
    state.count_refusal()  # before the agent started: told then, not again
    clock = Clock()
    advertiser = _advertiser(tmp_path, kubeconfig, [FakeDevice("GPU-a", 80 * GIB)], clock)
    advertiser.once()
    assert [e["reason"] for e in api.events()] == ["GPUInventoryChanged"]
    state.count_refusal()
    state.count_refusal()
    advertiser.once()
    [refused] = [e for e in api.events() if e["reason"] == "ContainerStartRefused"]
    assert refused["type"] == "Warning" and refused["regarding"] == REGARDING
    assert refused["series"]["count"] == 2
    assert "kubectl describe pod" in refused["note"]
    state.count_refusal()
    clock.now += 61
    advertiser.once()
    [refused] = [e for e in api.events() if e["reason"] == "ContainerStartRefused"]
    assert refused["series"]["count"] == 3


def test_install_and_uninstall_tell_the_node_what_they_changed(
    node: Node, library: Path, api: FakeNodesApi, kubeconfig: str
) -> None:
    common = ("--node-name", NODE, "--kubeconfig", kubeconfig)
    first = node.run("install", "--library", str(library), *common)
    assert first.returncode == 0, first.stderr
    again = node.run("install", "--library", str(library), *common)
    assert again.returncode == 0, again.stderr
    [installed] = api.events()  # the second changed nothing: no news
    assert (installed["reason"], installed["regarding"]) == ("VcudaInstalled", REGARDING)
    assert installed["note"].startswith("vcuda installed under /usr/local/vcuda; changed: ")
    assert "/etc/containerd/config.toml" in installed["note"]
    gone = node.run("uninstall", *common)
    assert gone.returncode == 0, gone.stderr
    uninstalled = api.events()[-1]
    assert uninstalled["reason"] == "VcudaUninstalled"
    assert "/etc/containerd/config.toml" in uninstalled["note"]
