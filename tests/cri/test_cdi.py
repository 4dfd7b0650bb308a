"""CDI through containerd: the CDI devices vcuda's placement device plugin names reach the
container as the spec it wrote says, and the hook holds them to the GPU chosen at bind; the
devices of a claim that vcuda's DRA driver prepared give the container its limits.

For the device plugin, kubelet's part is played here: it calls the plugin's ``Allocate``
(CDI device names), then ``PreStartContainer`` (the plugin writes each device's spec in
the node's ``/var/run/cdi``), then creates the container with those names, in
``ContainerConfig.CDI_devices`` (kubelet 1.28 and later) or in a ``cdi.k8s.io/``
annotation (earlier kubelets). Which pod holds the slots (kubelet's pod resources API
and the Node's ledger) is the one part stood in for.

For DRA, the driver's preparer runs in the node (it mounts the claim's account tmpfs
there) on a claim allocated as the scheduler writes it; NVIDIA's spec is a stand-in
(:mod:`tests.nvidia_cdi`). Its containers do not use the runtime class: CDI alone
gives them their limits.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from runtime_hook.contract import ACCOUNT_PATH, SHARED_RESOURCE, Limits, render_limits
from runtime_hook.device_assignment import DEVICE_LIST_DIR, DEVICE_LIST_SOURCE, ENV_NAME
from runtime_hook.node.device_plugin import DevicePlugin, Slots
from runtime_hook.node.dra.slices import DRIVER, device_name
from runtime_hook.node.protos import load
from tests.cri.client import CriError
from tests.cri.node import TRANSIENT_CDI_DIR, ContainerdNode
from tests.cri.pods import GIB, GPUS, SLEEP, placed_pod, read, refused
from tests.nvidia_cdi import write_nvidia_stand_in

messages = load("deviceplugin")[0]


@pytest.fixture
def cdi_node(node: ContainerdNode) -> ContainerdNode:
    if not node.release.has_cdi:
        pytest.skip(f"containerd {node.release.version} has no CDI (1.7 and later have)")
    return node


def _kubelet_allocates(node: ContainerdNode, gpu: int, slot: str = "s0007-1") -> list[str]:
    """What kubelet does for a container given ``slot`` of ``vcuda.io/shared-gpu`` on a node
    whose ledger holds GPU ``gpu`` for its pod: Allocate, then PreStartContainer; the CDI
    device names the plugin answered."""
    plugin = DevicePlugin(SHARED_RESOURCE, Slots(SHARED_RESOURCE, len(GPUS), 1),
                          lambda resource, ids: dict.fromkeys(ids, GPUS[gpu].uuid),
                          str(node.path(TRANSIENT_CDI_DIR)), logging.getLogger("vcuda-test"))
    answer = plugin.Allocate(messages.AllocateRequest(container_requests=[
        messages.ContainerAllocateRequest(devices_ids=[slot])]), None)
    plugin.PreStartContainer(messages.PreStartContainerRequest(devices_ids=[slot]),
                             SimpleNamespace(abort=pytest.fail))
    [container] = answer.container_responses
    return [device.name for device in container.cdi_devices]


def _as_kubelet_passes(devices: list[str], how: str) -> dict[str, Any]:
    if how == "field":
        return {"cdi_devices": devices}
    return {"annotations": {"cdi.k8s.io/vcuda-device-plugin_s0007-1": ",".join(devices)}}


def _edits(node: ContainerdNode, devices: list[str]) -> dict[str, dict]:
    """The container edits of each of ``devices`` in the node's CDI specs."""
    edits = {}
    for path in node.path(TRANSIENT_CDI_DIR).glob("*.json"):
        spec = json.loads(path.read_text())
        edits.update({f"{spec['kind']}={d['name']}": d["containerEdits"]
                      for d in spec["devices"] if f"{spec['kind']}={d['name']}" in devices})
    assert sorted(edits) == sorted(devices), list(node.path(TRANSIENT_CDI_DIR).iterdir())
    return edits


@pytest.mark.parametrize("how", ["field", "annotation"])
def test_the_placement_plugins_cdi_device_gives_the_container_exactly_its_spec_and_the_bound_gpu(
    cdi_node: ContainerdNode, how: str,
) -> None:
    devices = _kubelet_allocates(cdi_node, gpu=1)
    assert devices == ["vcuda.io/gpu=s0007-1"]
    worker = cdi_node.cri.run(placed_pod(cdi_node, "placed", 1), "worker", SLEEP,
                              **_as_kubelet_passes(devices, how))
    edits = _edits(cdi_node, devices)[devices[0]]
    spec = cdi_node.oci_spec(worker)
    # Exactly what the spec says: its environment line, its mount, and no hook of CDI's.
    assert edits["env"] == [f"{ENV_NAME}={DEVICE_LIST_DIR}"]
    assert edits["env"][0] in spec["process"]["env"]
    assert [(m["source"], m["destination"], m["options"]) for m in spec["mounts"]
            if m["destination"].startswith(DEVICE_LIST_DIR)] == [
        (m["hostPath"], m["containerPath"], m["options"]) for m in edits["mounts"]]
    assert edits["mounts"][0]["hostPath"] == DEVICE_LIST_SOURCE
    assert edits["mounts"][0]["containerPath"] == f"{DEVICE_LIST_DIR}/{GPUS[1].uuid}"
    base = json.loads(cdi_node.path("/etc/vcuda/base-runtime-spec.json").read_text())
    assert spec["hooks"] == base["hooks"]
    # In the running container: the device list and the limits of the GPU chosen at bind.
    listed = cdi_node.cri.exec(worker, "sh", "-c", f"echo ${ENV_NAME}; ls {DEVICE_LIST_DIR}")
    assert listed.stdout.decode().split() == [DEVICE_LIST_DIR, GPUS[1].uuid]
    assert read(cdi_node, worker, "/etc/vcuda/limits") == render_limits(
        Limits(memory=2 * GIB, cores=30, devices=(GPUS[1].uuid,), account=ACCOUNT_PATH))
    assert cdi_node.ledger() == [worker]


def test_a_cdi_device_of_another_gpu_than_the_one_bound_is_refused_by_the_hook(
    cdi_node: ContainerdNode,
) -> None:
    devices = _kubelet_allocates(cdi_node, gpu=0)  # a stale or forged spec: GPU 0
    _, line = refused(cdi_node, placed_pod(cdi_node, "split", 1), cdi_devices=devices)
    assert cdi_node.ledger() == []
    assert GPUS[0].uuid in line and GPUS[1].uuid in line and "; fix: " in line, line


def test_a_cdi_device_without_a_spec_fails_the_create_with_containerds_message(
    cdi_node: ContainerdNode,
) -> None:
    pod = placed_pod(cdi_node, "unwritten", 1)
    with pytest.raises(CriError, match=r"CDI device injection failed: unresolvable CDI devices "
                                       r"vcuda\.io/gpu=s0099-1$"):
        cdi_node.cri.create(pod, "worker", SLEEP, cdi_devices=["vcuda.io/gpu=s0099-1"])
    assert cdi_node.ledger() == []


def test_containerd_without_cdi_drops_the_devices_silently_so_the_gpu_never_arrives(
    node: ContainerdNode,
) -> None:
    if node.release.has_cdi:
        pytest.skip(f"containerd {node.release.version} has CDI")
    devices = _kubelet_allocates(node, gpu=1)
    worker = node.cri.run(placed_pod(node, "placed", 1), "worker", SLEEP, cdi_devices=devices)
    spec = node.oci_spec(worker)
    assert not [m for m in spec["mounts"] if m["destination"].startswith(DEVICE_LIST_DIR)]
    assert f"{ENV_NAME}={DEVICE_LIST_DIR}" not in spec["process"]["env"]


# --- DRA --------------------------------------------------------------------------------------

_PREPARER = """
import json, sys
from runtime_hook.contract import Sharing
from runtime_hook.node.dra.prepare import Paths, Preparer
paths = Paths("/", "/run/vcuda", "/var/run/cdi", "/usr/local/vcuda/lib/libvcuda.so", 16)
preparer = Preparer(paths, pool="node-1", sharing=Sharing())
claim = json.loads(sys.argv[1])
uid = claim["metadata"]["uid"]
if sys.argv[2] == "prepare":
    print(json.dumps([i for p in preparer.prepare(uid, claim) for i in p.cdi_ids]))
else:
    preparer.unprepare(uid)
"""


def _drive_preparer(node: ContainerdNode, claim: dict, call: str) -> str:
    done = node.in_node(sys.executable, "-c", _PREPARER, json.dumps(claim), call)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def prepared(cdi_node: ContainerdNode) -> Iterator[tuple[list[str], str]]:
    """A claim for 30% and 2 GiB of GPU 1, prepared on the node: its CDI devices, its UID."""
    uid = str(uuid.uuid4())
    result = {"request": "gpu", "driver": DRIVER, "pool": "node-1",
              "device": device_name(GPUS[1].uuid),
              "consumedCapacity": {"cores": "30", "memory": "2Gi"}}
    claim = {"metadata": {"namespace": "team-a", "name": "share", "uid": uid},
             "status": {"allocation": {"devices": {"results": [result]}}}}
    write_nvidia_stand_in(cdi_node.path(TRANSIENT_CDI_DIR), [g.uuid for g in GPUS])
    yield json.loads(_drive_preparer(cdi_node, claim, "prepare")), uid
    for pod in cdi_node.cri.pods():  # its containers first, as kubelet unprepares
        cdi_node.cri.remove_pod(pod)
    _drive_preparer(cdi_node, claim, "unprepare")


_SEEN = """
cat /etc/vcuda/limits /etc/ld.so.preload; echo "$NVIDIA_VISIBLE_DEVICES"; echo ---
(echo cores=100 > /etc/vcuda/limits) 2>&1; mv /etc/vcuda /etc/vcuda.moved 2>&1; echo ---
echo from-the-container > /run/vcuda/probe && echo written
"""


def test_a_claim_prepared_by_the_dra_driver_gives_the_container_its_limits_through_cdi(
    cdi_node: ContainerdNode, prepared: tuple[list[str], str],
) -> None:
    devices, uid = prepared
    assert devices == [f"nvidia.com/gpu={GPUS[1].uuid}", f"vcuda.io/claim={uid}"]
    pod = cdi_node.cri.run_pod("claimed", handler="")
    worker = cdi_node.cri.run(pod, "worker", SLEEP, cdi_devices=devices)
    seen, refused_writes, probe = cdi_node.cri.exec(
        worker, "sh", "-c", _SEEN).stdout.decode().split("---\n")
    assert seen == render_limits(Limits(memory=2 * GIB, cores=30, devices=(GPUS[1].uuid,),
                                        account=ACCOUNT_PATH)) + \
        f"/usr/local/vcuda/lib/libvcuda.so\n{GPUS[1].uuid}\n"
    assert "Read-only file system" in refused_writes and "busy" in refused_writes
    assert probe == "written\n"
    record = cdi_node.path(f"/run/vcuda/containers/claim-{uid}")
    assert (record / "account" / "probe").read_text() == "from-the-container\n"
    # Exactly the claim spec's mounts, and no hook: the runtime class is not used.
    edits = _edits(cdi_node, devices)[f"vcuda.io/claim={uid}"]
    spec = cdi_node.oci_spec(worker)
    targets = {m["containerPath"] for m in edits["mounts"]}
    assert sorted((m["source"], m["destination"], m["options"]) for m in spec["mounts"]
                  if m["destination"] in targets) == sorted(  # containerd orders them by path
        (m["hostPath"], m["containerPath"], m["options"]) for m in edits["mounts"])
    assert not spec.get("hooks")
