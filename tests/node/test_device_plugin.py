"""vcuda's device plugin driven by a fake kubelet over its real gRPC sockets: each container
gets exactly the GPUs its pod was bound with, and a start that cannot be honoured says why."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runtime_hook.contract import (
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    SHARED_RESOURCE,
    WHOLE_RESOURCE,
    Gpu,
    Sharing,
)
from runtime_hook.node.agent import published
from runtime_hook.node.device_plugin import slots_per_gpu
from runtime_hook.placement import decode_inventory, decode_ledger
from tests.extender.cluster import GIB, RunningExtender, binding_args, gpu_uuid, pod_object
from tests.fake_cluster_api import FakeClusterApi, running
from tests.node.fake_kubelet import StartError
from tests.node.gpu_node import GpuNode, register

NODE = "gpu-1"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeClusterApi]:
    with running(tmp_path) as server:
        yield server


@pytest.fixture
def node(api: FakeClusterApi, tmp_path: Path) -> Iterator[GpuNode]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig())
    register(api, NODE)
    gpu_node = GpuNode(tmp_path / NODE, NODE, [16 * GIB, 16 * GIB], str(kubeconfig),
                       logging.getLogger("test"))
    gpu_node.ready()
    yield gpu_node
    gpu_node.stop()


@pytest.fixture
def extender(api: FakeClusterApi, tmp_path: Path, node: GpuNode) -> Iterator[RunningExtender]:
    running = RunningExtender(api, tmp_path / "extender.log", clock=time.time)
    yield running
    running.stop()


def bound(api: FakeClusterApi, extender: RunningExtender, pod: dict) -> dict:
    api.add_pod(pod)
    assert extender.verb("/bind", binding_args(pod, NODE)) == {}
    return api.get(f"/api/v1/namespaces/team/pods/{pod['metadata']['name']}")


def test_the_agent_publishes_its_gpus_with_a_heartbeat(api: FakeClusterApi,
                                                       node: GpuNode) -> None:
    annotations = api.get(f"/api/v1/nodes/{NODE}")["metadata"]["annotations"]
    inventory = decode_inventory(annotations[INVENTORY_ANNOTATION])
    assert [g.uuid for g in inventory.gpus] == [gpu_uuid(NODE, 0), gpu_uuid(NODE, 1)]
    assert inventory.heartbeat > 0


def test_two_pods_of_one_size_on_two_gpus_each_get_their_own_whatever_the_order(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    first = bound(api, extender, pod_object("first", cores=60, memory_gib=10))
    second = bound(api, extender, pod_object("second", cores=60, memory_gib=10))
    node.kubelet.admit(first)
    node.kubelet.admit(second)
    # Started in the other order than admitted: no pod is told apart by its size or turn.
    assert node.kubelet.start_container("team", "second", "share") == [gpu_uuid(NODE, 1)]
    assert node.kubelet.start_container("team", "first", "share") == [gpu_uuid(NODE, 0)]


def test_a_two_gpu_share_gets_both_gpus_it_was_bound_with(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    pod = bound(api, extender, pod_object("tp", cores=30, memory_gib=4, gpus=2))
    node.kubelet.admit(pod)
    got = node.kubelet.start_container("team", "tp", "share")
    assert sorted(got) == [gpu_uuid(NODE, 0), gpu_uuid(NODE, 1)]


def test_whole_gpus_go_to_the_whole_pod_and_never_to_the_shared_one(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    shared = bound(api, extender, pod_object("shared", cores=10, memory_gib=1))
    whole = bound(api, extender, pod_object("whole", whole=1))
    for pod in (shared, whole):
        node.kubelet.admit(pod)
    got_shared = node.kubelet.start_container("team", "shared", "share")
    got_whole = node.kubelet.start_container("team", "whole", "whole")
    assert len(got_whole) == 1 and set(got_shared).isdisjoint(got_whole)


def test_a_pod_placed_without_vcudas_scheduler_fails_at_start_with_what_to_do(
        api: FakeClusterApi, node: GpuNode) -> None:
    pod = pod_object("stray", cores=10, memory_gib=1)
    pod["spec"]["nodeName"] = NODE
    api.add_pod(pod)
    node.kubelet.admit(pod)
    with pytest.raises(StartError, match="pod team/stray has no GPU assignment: vcuda's "
                                         "scheduler did not place it; give it schedulerName "
                                         "vcuda-scheduler"):
        node.kubelet.start_container("team", "stray", "share")


def test_a_bound_gpu_gone_from_the_node_fails_the_start_naming_the_gpu(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    pod = bound(api, extender, pod_object("p", cores=10, memory_gib=1))
    node.kubelet.admit(pod)
    node.gpus = node.gpus[1:]  # GPU 0 fell off the bus
    node.agent_pass()
    with pytest.raises(StartError, match=f"GPU {gpu_uuid(NODE, 0)}, given to pod team/p at "
                                         f"bind, is not on node {NODE} now \\(it has "
                                         f"{gpu_uuid(NODE, 1)}\\)"):
        node.kubelet.start_container("team", "p", "share")


def test_a_slot_whose_pod_ended_gets_a_new_id_and_its_spec_goes(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    pod = bound(api, extender, pod_object("p", cores=10, memory_gib=1))
    node.kubelet.admit(pod)
    node.kubelet.start_container("team", "p", "share")
    [held] = node.kubelet.held
    node.kubelet.remove("team", "p")
    node.agent_pass()
    # The list sent before the pass has 200 devices too: wait for the one without that slot.
    node.kubelet.wait_for_devices("vcuda.io/shared-gpu", 200, gone=held.ids[0])
    assert held.ids[0] not in node.kubelet.devices["vcuda.io/shared-gpu"]
    assert node.agent._served["vcuda.io/shared-gpu"].plugin.written() == []


def test_the_ledger_line_of_a_deleted_pod_is_pruned_and_its_room_comes_back(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    pod = bound(api, extender, pod_object("p", cores=10, memory_gib=1))
    done = bound(api, extender, pod_object("done", cores=10, memory_gib=1))
    api.objects["/api/v1/namespaces/team/pods/done"]["status"] = {"phase": "Succeeded"}
    api.remove(f"/api/v1/namespaces/team/pods/{pod['metadata']['name']}")
    node.agent_pass()
    ledger = decode_ledger(api.get(f"/api/v1/nodes/{NODE}")["metadata"]["annotations"][
        LEDGER_ANNOTATION])
    assert set(ledger) == {pod["metadata"]["uid"]}  # gone from the API, but within the grace
    node.agent._clock = lambda: time.time() + 120
    node.agent_pass()
    assert decode_ledger(api.get(f"/api/v1/nodes/{NODE}")["metadata"]["annotations"][
        LEDGER_ANNOTATION]) == {}
    assert done  # ended pods are pruned at once


def test_pods_seen_to_end_lose_their_lines_at_once_in_one_write_without_the_grace(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    pods = [bound(api, extender, pod_object(name, cores=10, memory_gib=1))
            for name in ("a", "b", "kept")]
    node_path = f"/api/v1/nodes/{NODE}"
    writes = len(api.node_events)
    node.agent._pruner.start()  # the pruner alone: its watch's part is tests/node/test_ended_pods
    for pod in pods[:2]:
        api.remove(f"/api/v1/namespaces/team/pods/{pod['metadata']['name']}")
        node.agent.pod_ended(pod["metadata"]["uid"])
    deadline = time.monotonic() + 5
    while len(decode_ledger(api.get(node_path)["metadata"]["annotations"][
            LEDGER_ANNOTATION])) != 1:
        assert time.monotonic() < deadline, "the ended pods' lines are still there"
        time.sleep(0.05)
    assert set(decode_ledger(api.get(node_path)["metadata"]["annotations"][
        LEDGER_ANNOTATION])) == {pods[2]["metadata"]["uid"]}
    assert len(api.node_events) - writes == 1  # both ends in one ledger write


def test_a_restarted_agent_serves_pods_bound_before_it_restarted(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    pod = bound(api, extender, pod_object("p", cores=10, memory_gib=1))
    node.kubelet.admit(pod)
    node.restart_agent()
    node.kubelet.wait_for_devices("vcuda.io/shared-gpu", 200)
    assert node.kubelet.start_container("team", "p", "share") == [gpu_uuid(NODE, 0)]


def listening(path: str) -> int:
    """How many listening sockets are bound at ``path`` (an unlinked path's server still
    counts: the kernel keeps the name it was bound with)."""
    with open("/proc/net/unix", encoding="ascii") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    # gRPC binds "unix://<path>" at "///<path>"; flag __SO_ACCEPTCON marks a listening one.
    return sum(1 for row in rows if len(row) == 8 and "/" + row[7].lstrip("/") == path
               and int(row[3], 16) & 0x10000)


def test_after_kubelet_restarts_the_plugins_register_again_and_the_old_servers_stop(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    served = node.agent._served["vcuda.io/shared-gpu"]
    assert listening(served.socket) == 1
    for _ in range(3):
        node.kubelet.registered.clear()
        node.kubelet.restart()  # the plugins' sockets are removed
        node.agent_pass()
        assert node.kubelet.registered.wait(10)
    assert listening(served.socket) == 1  # not one server more per kubelet restart
    node.kubelet.wait_for_devices("vcuda.io/shared-gpu", 200)
    pod = bound(api, extender, pod_object("p", cores=10, memory_gib=1))
    node.kubelet.admit(pod)
    assert node.kubelet.start_container("team", "p", "share") == [gpu_uuid(NODE, 0)]


def test_a_plugin_kubelet_does_not_answer_is_not_served_and_the_next_pass_registers_it(
        node: GpuNode) -> None:
    served = node.agent._served["vcuda.io/shared-gpu"]
    kubelet_socket = Path(node.paths.plugin_dir) / "kubelet.sock"
    node.kubelet.restart()
    kubelet_socket.rename(kubelet_socket.with_name("away"))  # not listening yet
    with pytest.raises(RuntimeError, match="registering vcuda.io/shared-gpu with kubelet "
                                           f"\\({kubelet_socket}\\): UNAVAILABLE"):
        served.start()
    assert not served.alive() and listening(served.socket) == 0
    node.agent_pass()  # the agent's pass reports it and goes on
    assert not served.alive()
    kubelet_socket.with_name("away").rename(kubelet_socket)
    node.agent_pass()
    assert served.alive() and listening(served.socket) == 1
    node.kubelet.wait_for_devices("vcuda.io/shared-gpu", 200)


def test_starts_and_stops_of_one_plugin_from_several_threads_never_collide(
        node: GpuNode) -> None:
    served = node.agent._served["vcuda.io/shared-gpu"]
    failures: list[BaseException] = []

    def at_once(*calls: Callable[[], None]) -> None:
        barrier = threading.Barrier(len(calls))

        def call(what: Callable[[], None]) -> None:
            barrier.wait()
            try:
                what()
            except BaseException as exc:  # every one is a failure the test reports
                failures.append(exc)

        threads = [threading.Thread(target=call, args=(what,)) for what in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    for _ in range(10):
        at_once(served.start, served.start, served.start)
        assert failures == []
        assert served.alive() and listening(served.socket) == 1
    at_once(served.start, served.stop)
    # The start either came first and was stopped, or came after the stop and refused.
    assert all(isinstance(exc, RuntimeError) and "was stopped" in str(exc) for exc in failures)
    assert not served.alive() and listening(served.socket) == 0


def test_a_plugin_gone_at_allocate_is_an_admission_error_and_kubelet_holds_nothing(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    pod = bound(api, extender, pod_object("p", cores=10, memory_gib=1))
    node.agent.stop()
    with pytest.raises(StartError, match=r"UnexpectedAdmissionError: Allocate of "
                                         r"vcuda\.io/shared-gpu: UNAVAILABLE"):
        node.kubelet.admit(pod)
    assert node.kubelet.held == []


def test_prestart_of_an_id_the_plugin_never_advertised_is_refused_and_writes_no_file(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender, tmp_path: Path) -> None:
    pod = bound(api, extender, pod_object("p", cores=10, memory_gib=1))
    escape = "../../../escape"
    node.kubelet.hold(pod, "share", "vcuda.io/shared-gpu", [escape])
    with pytest.raises(StartError, match=re.escape(
            f"PreStartContainer of vcuda.io/shared-gpu: vcuda: vcuda.io/shared-gpu: device ID "
            f"'{escape}' is not one this plugin gave out (its IDs are s<slot, 4 digits>-"
            "<generation>)")):
        node.kubelet.start_container("team", "p", "share")
    cdi = Path(node.paths.cdi_dir)
    assert not (cdi.parent.parent / "escape.json").exists()
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == []


def test_prestart_of_one_slot_twice_is_refused_and_does_not_repoint_the_slot(
        api: FakeClusterApi, node: GpuNode, extender: RunningExtender) -> None:
    pod = bound(api, extender, pod_object("two", whole=2))
    slot = node.kubelet.devices["vcuda.io/gpu"][0]
    node.kubelet.hold(pod, "whole", "vcuda.io/gpu", [slot, slot])
    with pytest.raises(StartError, match=re.escape(
            f"PreStartContainer of vcuda.io/gpu: vcuda: vcuda.io/gpu: device ID '{slot}' is "
            "asked for more than once")):
        node.kubelet.start_container("team", "two", "whole")
    assert node.agent._served["vcuda.io/gpu"].plugin.written() == []


def test_allocate_refuses_unknown_and_repeated_ids_and_answers_advertised_ones(
        node: GpuNode) -> None:
    first, second = node.kubelet.devices["vcuda.io/shared-gpu"][:2]
    prefix = "Allocate of vcuda.io/shared-gpu: INVALID_ARGUMENT vcuda: vcuda.io/shared-gpu: "
    generation = int(first.split("-")[1])
    for unknown in (f"s0200-{generation}", f"s0000-{generation + 1}", "w0000-1", "s0000-1/../x",
                    "s00-1"):
        with pytest.raises(StartError, match=re.escape(
                f"{prefix}device ID {unknown!r} is not one this plugin gave out")):
            node.kubelet.allocate_ids("vcuda.io/shared-gpu", [first, unknown])
    with pytest.raises(StartError, match=re.escape(
            f"{prefix}device ID '{first}' is asked for more than once")):
        node.kubelet.allocate_ids("vcuda.io/shared-gpu", [first, first])
    assert node.kubelet.allocate_ids("vcuda.io/shared-gpu", [first, second]) == [
        f"vcuda.io/gpu={first}", f"vcuda.io/gpu={second}"]


def test_a_shared_gpu_gives_a_slot_for_each_sharer_it_takes_and_a_whole_gpu_one() -> None:
    assert slots_per_gpu(SHARED_RESOURCE, Gpu("GPU-a", 0, GIB)) == 100
    assert slots_per_gpu(SHARED_RESOURCE, Gpu("GPU-a", 0, GIB, cores=150)) == 150
    assert slots_per_gpu(SHARED_RESOURCE, Gpu("GPU-a", 0, GIB, cores=150, sharers=4)) == 4
    assert slots_per_gpu(WHOLE_RESOURCE, Gpu("GPU-a", 0, GIB, sharers=4)) == 1


def test_a_node_with_overcommit_and_a_cap_publishes_both_and_placement_holds_them(
        api: FakeClusterApi, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig())
    register(api, "gpu-2")
    node = GpuNode(tmp_path / "gpu-2", "gpu-2", [16 * GIB, 16 * GIB], str(kubeconfig),
                   logging.getLogger("test"))
    node.gpus = published(node.gpus, Sharing(cores_scaling=1.2, max_sharers=2))
    extender = RunningExtender(api, tmp_path / "extender.log", clock=time.time)
    try:
        node.agent_pass()
        node.kubelet.wait_for_devices(SHARED_RESOURCE, 2 * 2)  # two sharers on each of two GPUs
        annotations = api.get("/api/v1/nodes/gpu-2")["metadata"]["annotations"]
        gpus = decode_inventory(annotations[INVENTORY_ANNOTATION]).gpus
        assert [(g.cores, g.sharers) for g in gpus] == [(120, 2), (120, 2)]
        for name in ("a", "b", "c", "d"):  # 60% each: two on a GPU, past 100% of its time
            pod = pod_object(name, cores=60, memory_gib=1)
            api.add_pod(pod)
            assert extender.verb("/bind", binding_args(pod, "gpu-2")) == {}
        fifth = pod_object("e", cores=1, memory_gib=1)
        api.add_pod(fifth)
        answer = extender.verb("/bind", binding_args(fifth, "gpu-2"))
        assert answer == {"Error": "node gpu-2: no GPU has 1 percent and 1 GiB free and room "
                          "for one more sharer (GPU 0 has 2 sharers, the most its node "
                          "allows on one GPU, the closest)"}
    finally:
        extender.stop()
        node.stop()
