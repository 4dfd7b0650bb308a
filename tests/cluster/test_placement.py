"""Per-GPU placement on the real cluster with the second scheduler (``scripts/cluster up
--with-vcuda placement``): the ``vcuda-scheduler`` Deployment runs the cluster's own
kube-scheduler, which calls vcuda's extender beside it; vcuda's device plugin is registered with
the real kubelet. The node has two GPUs, of 16 GiB (index 0) and 8 GiB (index 1)."""

from __future__ import annotations

import json
import subprocess
import time
from collections import defaultdict

from runtime_hook.contract import INVENTORY_ANNOTATION
from runtime_hook.placement import PlacementError
from tests.cluster import placement as p
from tests.cluster.kube import Cluster
from tests.cluster.vcuda import NAMESPACE, REPO

BIG = p.share(20, 10)  # only the 16 GiB GPU holds it
SMALL = p.share(10, 2)  # either GPU holds it
BURST = 100
BURST_FITS = 64 + 32  # 256 MiB shares on the 16 and 8 GiB GPUs


def _uuids(cluster: Cluster) -> tuple[str, str]:
    large, small = p.gpus(cluster)
    assert (large.memory, small.memory) == (16 << 30, 8 << 30)
    return large.uuid, small.uuid


def test_vcuda_scheduler_is_the_clusters_kube_scheduler_and_kubelet_has_vcudas_plugins(
        placement: Cluster) -> None:
    pods = placement.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vcuda-scheduler")
    version = json.loads(placement.ok("get", "--raw", "/version"))["gitVersion"]
    assert len(pods["items"]) == 2
    for pod in pods["items"]:
        images = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
        assert images["kube-scheduler"] == f"registry.k8s.io/kube-scheduler:{version}"
        assert all(c["ready"] for c in pod["status"]["containerStatuses"])
    lease = placement.get("lease", "vcuda-scheduler", "-n", NAMESPACE)
    assert lease["spec"]["holderIdentity"].split("_")[0] in {
        pod["metadata"]["name"] for pod in pods["items"]}
    allocatable = placement.get("node", p.NODE)["status"]["allocatable"]
    assert (allocatable["vcuda.io/shared-gpu"], allocatable["vcuda.io/gpu"]) == ("200", "2")
    assert "nvidia.com/gpu.shared" not in allocatable  # NVIDIA's plugin does not run here


def test_a_share_only_the_large_gpu_holds_lands_there_and_binpack_puts_a_smaller_one_beside(
        placement: Cluster) -> None:
    """Each container gets exactly the GPU recorded at bind: in the ledger, on the pod, in the
    OCI spec containerd ran, and as the memory a CUDA program in it sees."""
    large, _ = _uuids(placement)
    image = placement.vcuda_image()
    p.create(placement, p.pod("big", image, BIG))
    try:
        p.wait_running(placement, "big")
        got = placement.get("pod", "big", "-n", "default")
        assert got["spec"]["schedulerName"] == "vcuda-scheduler"  # the webhook's
        assigned = p.assignment(placement, "big")
        assert assigned.shared == (large, 20, 10 << 30) and assigned.whole == ()
        line = p.ledger(placement)[got["metadata"]["uid"]]
        assert line.pod == "default/big" and line.assignment == assigned
        assert p.spec_gpus(placement, "big") == [large]
        assert p.cuda_total(placement, "big") == 10 << 30  # the share, on that GPU
        p.create(placement, p.pod("small", image, SMALL))  # either GPU holds it
        p.wait_running(placement, "small")
        assert p.assignment(placement, "small").shared == (large, 10, 2 << 30)
        assert p.spec_gpus(placement, "small") == [large]
        assert p.cuda_total(placement, "small") == 2 << 30
    finally:
        p.delete(placement, "big", "small")


def test_a_whole_gpu_pod_gets_an_unused_gpu_that_no_share_joins_until_it_ends(
        placement: Cluster) -> None:
    """With a share on the large GPU, a whole-GPU pod gets the small one; a share that only
    the small GPU could hold then stays Pending with the extender's reason in its events, and
    lands there once the whole-GPU pod is gone."""
    large, small = _uuids(placement)
    image = placement.vcuda_image()
    p.create(placement, p.pod("big", image, BIG))
    try:
        p.wait_running(placement, "big")
        p.create(placement, p.pod("whole", image, p.WHOLE))
        p.wait_running(placement, "whole")
        assert p.assignment(placement, "whole").whole == (small,)
        assert p.spec_gpus(placement, "whole") == [small]
        assert p.cuda_total(placement, "whole") == 8 << 30  # the whole small GPU, no limit
        p.create(placement, p.pod("waits", image, p.share(10, 7)))
        # as the event shows it: the reason holds no '%' (printf verbs in kube-scheduler's)
        reason = ("no GPU has 10 percent and 7 GiB free (GPU 0 has 80 percent and 6 GiB free, "
                  "the closest)")
        p.assert_waits_for(placement, "waits", reason)
        p.delete(placement, "whole")
        p.wait_running(placement, "waits")
        assert p.assignment(placement, "waits").shared == (small, 10, 7 << 30)
        assert p.spec_gpus(placement, "waits") == [small]
        assert large != small
    finally:
        p.delete(placement, "big", "whole", "waits")


def test_a_share_of_two_gpus_takes_both_and_one_that_only_one_gpu_holds_waits_for_room(
        placement: Cluster) -> None:
    """``docker.com/vcuda-gpus: 2`` is the same share on two distinct GPUs: the extender
    records both at bind, the device plugin hands out both, and the container sees its
    memory limit on each. A second pair that only the large GPU has room for stays Pending
    with the extender's reason until the first is gone."""
    large, small = _uuids(placement)
    image = placement.vcuda_image()
    pair = {**p.share(30, 4), "docker.com/vcuda-gpus": "2"}
    p.create(placement, p.pod("pair", image, pair))
    try:
        p.wait_running(placement, "pair")
        assigned = p.assignment(placement, "pair")
        assert sorted(assigned.shared_gpus()) == sorted((large, small))
        assert assigned.shared[1:] == (30, 4 << 30) and assigned.whole == ()
        uid = placement.get("pod", "pair", "-n", "default")["metadata"]["uid"]
        assert p.ledger(placement)[uid].assignment == assigned
        assert p.spec_gpus(placement, "pair") == sorted((large, small))
        assert p.cuda_total(placement, "pair") == 4 << 30  # device 0's limit, not its size
        p.create(placement, p.pod("pair-big", image,
                                  {**p.share(20, 6), "docker.com/vcuda-gpus": "2"}))
        reason = ("2 GPUs with 20 percent and 6 GiB free each wanted, 1 of 2 has it (GPU 1 "
                  "has 70 percent and 4 GiB free, the closest)")
        p.assert_waits_for(placement, "pair-big", reason)
        p.delete(placement, "pair")
        p.wait_running(placement, "pair-big")
        assert sorted(p.assignment(placement, "pair-big").shared_gpus()) == sorted(
            (large, small))
    finally:
        p.delete(placement, "pair", "pair-big")


def _phases(cluster: Cluster, names: list[str]) -> dict[str, set[str]]:
    """The pods of ``names`` by phase."""
    wanted = set(names)
    by_phase: dict[str, set[str]] = defaultdict(set)
    for pod in cluster.get("pods", "-n", "default")["items"]:
        if pod["metadata"]["name"] in wanted:
            by_phase[pod["status"].get("phase", "Pending")].add(pod["metadata"]["name"])
    return by_phase


def _wait_phases(cluster: Cluster, names: list[str], running: int,
                 timeout: float) -> set[str]:
    """Until ``running`` of the pods ``names`` run; their names."""
    deadline = time.monotonic() + timeout
    while len(now := _phases(cluster, names)["Running"]) < running:
        assert time.monotonic() < deadline, f"{len(now)} of {running} pods run"
        time.sleep(2)
    return now


def _restart(component: str) -> None:
    subprocess.run([str(REPO / "scripts" / "cluster"), "restart", component], check=True,
                   timeout=120)


def _container_ids(cluster: Cluster, *names: str) -> dict[str, str]:
    return {name: cluster.get("pod", name, "-n", "default")["status"]["containerStatuses"][0]
            ["containerID"] for name in names}


def test_kubelet_restarted_with_pods_running_keeps_their_gpus_and_places_new_pods(
        placement: Cluster) -> None:
    large, small = _uuids(placement)
    image = placement.vcuda_image()
    p.create(placement, p.pod("big", image, BIG), p.pod("whole", image, p.WHOLE))
    try:
        p.wait_running(placement, "big", "whole")
        before = _container_ids(placement, "big", "whole")
        sockets = p.plugin_sockets(placement)
        _restart("kubelet")
        p.wait_plugins_served_again(placement, sockets)
        p.ready(placement)
        assert _container_ids(placement, "big", "whole") == before  # not started again
        assert (p.spec_gpus(placement, "big"), p.spec_gpus(placement, "whole")) == \
            ([large], [small])
        # kubelet's checkpoint still holds the running pods' slots: a new share gets others,
        # and no GPU is given whole again (the scheduler's own fit already finds the node's
        # vcuda-core taken: 20 + 100 + 10 of 200).
        p.create(placement, p.pod("after", image, SMALL), p.pod("whole-2", image, p.WHOLE))
        p.wait_running(placement, "after")
        assert p.spec_gpus(placement, "after") == [large]
        assert p.cuda_total(placement, "after") == 2 << 30
        events = placement.events("whole-2", "0/1 nodes are available", timeout=60)
        assert "0/1 nodes are available" in events, events
        assert p.stays_pending(placement, "whole-2", 5)
    finally:
        p.delete(placement, "big", "whole", "after", "whole-2")


def _running_uid(cluster: Cluster, name: str) -> str:
    """The UID of pod ``name`` once it runs."""
    p.wait_running(cluster, name)
    return str(cluster.get("pod", name, "-n", "default")["metadata"]["uid"])


def test_a_deleted_pods_room_comes_back_within_seconds_not_at_the_agents_next_pass(
        placement: Cluster) -> None:
    """The node agent watches its node's pods: the line of one deleted goes as it goes (its
    pass, every 30 s, would take a line only once a minute old), and a share that fits only in
    the room it held is placed at once."""
    large, _ = _uuids(placement)
    image = placement.vcuda_image()
    p.create(placement, p.pod("big", image, BIG))
    try:
        uid = _running_uid(placement, "big")
        placement.ok("delete", "pod", "-n", "default", "big", "--wait=true", timeout=300)
        gone = time.monotonic()
        while uid in p.ledger(placement):
            assert time.monotonic() - gone < 5, "the deleted pod's ledger line is still there"
            time.sleep(0.2)
        p.create(placement, p.pod("big-2", image, BIG))  # 10 GiB more fits only without "big"
        p.wait_running(placement, "big-2", timeout=60)
        assert p.spec_gpus(placement, "big-2") == [large]
    finally:
        p.delete(placement, "big", "big-2")


def test_the_node_agent_restarted_keeps_running_containers_and_places_new_pods(
        placement: Cluster) -> None:
    large, _ = _uuids(placement)
    image = placement.vcuda_image()
    p.create(placement, p.pod("big", image, BIG))
    try:
        uid = _running_uid(placement, "big")
        before = _container_ids(placement, "big")
        sockets = p.plugin_sockets(placement)
        placement.ok("delete", "pod", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vcuda-node",
                     "--wait=true")
        placement.ok("rollout", "status", "-n", NAMESPACE, "daemonset/vcuda-node",
                     "--timeout=180s")
        p.wait_plugins_served_again(placement, sockets)
        p.ready(placement)
        assert _container_ids(placement, "big") == before
        assert p.cuda_total(placement, "big") == 10 << 30
        assert uid in p.ledger(placement)  # the agent prunes only lines of ended pods
        p.create(placement, p.pod("after", image, SMALL))
        p.wait_running(placement, "after")
        assert p.spec_gpus(placement, "after") == [large]
    finally:
        p.delete(placement, "big", "after")


def _node_warning(cluster: Cluster, reason: str, seen: set[str], timeout: float) -> dict | None:
    """A new Event of ``reason`` on the test node (none of ``seen``), once there is one; None
    after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        new = [event for event in p.node_events(cluster, reason)
               if event["metadata"]["name"] not in seen]
        if new or time.monotonic() > deadline:
            return new[0] if new else None
        time.sleep(1)


def _inventory_garbled(cluster: Cluster) -> None:
    cluster.ok("annotate", "node", p.NODE, "--overwrite", f"{INVENTORY_ANNOTATION}={{")


def test_a_node_whose_inventory_cannot_be_read_gets_the_extenders_warning_and_its_reason(
        placement: Cluster) -> None:
    """Garbled by hand, the node's GPU inventory leaves it out of placement: the pod waits with
    the extender's reason in its events, and the Node carries the extender's Warning Event,
    written under its shipped RBAC by the real events API. The agent publishes again at its
    next pass (every 30 s): if that comes before the scheduler's filter, the pod runs and the
    garbling is tried again."""
    image = placement.vcuda_image()
    seen = {event["metadata"]["name"]
            for event in p.node_events(placement, "GPUInventoryUnreadable")}
    try:
        for _ in range(3):
            _inventory_garbled(placement)
            p.create(placement, p.pod("unread", image, SMALL))
            warning = _node_warning(placement, "GPUInventoryUnreadable", seen, 20)
            if warning is not None:
                break
            p.delete(placement, "unread")  # the agent published first
        assert warning is not None, "no GPUInventoryUnreadable Event on the node"
        assert (warning["type"], warning["reportingComponent"], warning["action"]) == (
            "Warning", "vcuda.io/scheduler-extender", "LeaveOutOfPlacement")
        assert warning["message"].endswith(": check the vcuda node agent of this node")
        events = placement.events("unread", warning["message"], timeout=60)
        assert warning["message"] in events, events
    finally:
        p.delete(placement, "unread")
        p.ready(placement)
        deadline = time.monotonic() + 90  # the agent's next pass writes the inventory again
        while True:
            try:
                p.gpus(placement)
                break
            except PlacementError:
                assert time.monotonic() < deadline, "the agent did not publish its GPUs again"
                time.sleep(2)


def test_the_extender_restarted_during_a_burst_places_every_pod_within_its_gpus(
        placement: Cluster) -> None:
    """A burst of 100 of the smallest shares (1 percent, 256 MiB) while each extender is
    restarted: the GPUs hold 64 + 32 of them, so exactly 96 run, each on the GPU the ledger
    gives it, and 4 stay Pending; no GPU holds more than it has, no container is refused."""
    image = placement.vcuda_image()
    names = [f"burst-{n}" for n in range(BURST)]
    schedulers = placement.ok("get", "pods", "-n", NAMESPACE, "-l",
                              "app.kubernetes.io/name=vcuda-scheduler", "-o",
                              "jsonpath={.items[*].metadata.name}").split()
    p.create(placement, *(p.pod(name, image, p.share(1, 0.25)) for name in names))
    try:
        for scheduler in schedulers:  # SIGTERM to the extender: its container starts again
            placement.ok("exec", "-n", NAMESPACE, scheduler, "-c", "extender", "--", "sh", "-c",
                         "kill 1")
        running = _wait_phases(placement, names, running=BURST_FITS, timeout=900)
        assert p.stays_pending(placement, next(n for n in names if n not in running), 5)
        assert len(_phases(placement, names)["Pending"]) == BURST - BURST_FITS
        entries = p.ledger(placement)
        uids = {placement.get("pod", name, "-n", "default")["metadata"]["uid"]: name
                for name in running}
        assert {uid for uid in entries if uid in uids} == set(uids)
        used: dict[str, int] = defaultdict(int)
        for entry in entries.values():
            if entry.assignment.shared:
                used[entry.assignment.shared[0]] += entry.assignment.shared[2]
        memory = {gpu.uuid: gpu.memory for gpu in p.gpus(placement)}
        assert all(used[uuid] <= memory[uuid] for uuid in used), used
        for uid, name in uids.items():
            assert p.spec_gpus(placement, name) == list(entries[uid].assignment.gpus())
        restarts = placement.ok("get", "pods", "-n", NAMESPACE, "-l",
                                "app.kubernetes.io/name=vcuda-scheduler", "-o",
                                "jsonpath={.items[*].status.containerStatuses[?(@.name=="
                                "'extender')].restartCount}").split()
        assert restarts and all(int(count) >= 1 for count in restarts)
        failed = placement.ok("get", "events", "-n", "default", "--field-selector",
                              "reason=Failed", "-o", "jsonpath={range .items[*]}"
                              "{.involvedObject.name}: {.message}{'\\n'}{end}")
        refused = [line for line in failed.splitlines() if line.startswith("burst-")]
        assert not refused, refused  # 0 containers refused at start
    finally:
        p.delete(placement, *names)
