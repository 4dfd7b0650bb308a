"""The kubelet plugin end to end: kubelet registers it through the registration socket and
calls Prepare and Unprepare over gRPC for claims that the scheduler's rules allocated and that
the API serves."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runtime_hook import contract, ledger
from runtime_hook.contract import Sharing
from runtime_hook.node.dra.prepare import RECORD_PREFIX, Paths, PrepareError, Preparer
from runtime_hook.node.dra.slices import device_name
from runtime_hook.node_state import LIMITS_FILE, PRELOAD_FILE, StateDir, process_start_time
from tests.dra.conftest import GPU0, GPU1, LIBRARY, NODE, DraNode
from tests.dra.fake_dra_api import slice_path
from tests.node.fake_pynvml import GIB


def _state(node: DraNode) -> StateDir:
    return StateDir(str(node.state_dir))


def _spec_file(node: DraNode, uid: str) -> Path:
    return node.cdi_dir / f"vcuda.io-claim_{uid}.json"


def _spec(node: DraNode, uid: str) -> dict:
    return json.loads(_spec_file(node, uid).read_text())


def _record_dir(node: DraNode, uid: str) -> Path:
    return node.state_dir / "containers" / f"{RECORD_PREFIX}{uid}"


def _gpu_of(claim: dict) -> str:
    """The UUID of the GPU the scheduler gave ``claim``'s one result."""
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return GPU0 if result["device"] == device_name(GPU0) else GPU1


def _commit(node: DraNode, container_id: str, pid: int, memory: int, cores: int,
            gpu: str) -> None:
    """A ledger record as the hook (or a crashed prepare, with pid 0) leaves it."""
    state = _state(node)
    start_time = process_start_time(pid) if pid else 0
    with state.locked(5):
        ledger.commit(state, ledger.Entry(
            container_id=container_id, namespace="team-b", pod="p", container="worker",
            pid=pid, start_time=start_time, memory=memory, cores=cores, devices=(gpu,)))


def _record(node: DraNode, uid: str) -> ledger.Entry | None:
    return next((e for e in ledger.entries(_state(node))
                 if e.container_id == RECORD_PREFIX + uid), None)


def test_kubelet_registers_the_plugin_as_a_v1_dra_driver_with_its_service_socket(
        dra_node: DraNode) -> None:
    info = dra_node.kubelet.info
    assert (info.type, info.name) == ("DRAPlugin", "vcuda.io")
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    assert info.endpoint == f"{dra_node.base}/kubelet/plugins/vcuda.io/dra.sock"
    assert (dra_node.base / "kubelet/plugins_registry/vcuda.io-reg.sock").is_socket()
    assert dra_node.driver.plugin.registered is True


def test_a_slice_kubelet_deleted_at_its_start_is_published_again_when_it_registers_the_plugin(
        dra_node: DraNode) -> None:
    """Kubelet deletes its node's ResourceSlices when it starts, then registers the plugins
    it finds: the slice comes back with the registration, not at the agent's next pass."""
    path = slice_path(f"{NODE}-vcuda.io")
    published = dra_node.api.get(path)
    with dra_node.api.lock:
        dra_node.api.store(path, None)
    dra_node.kubelet.register()
    again = dra_node.api.get(path)
    assert again is not None and again["spec"]["devices"] == published["spec"]["devices"]

def test_prepare_gives_the_gpu_and_a_cdi_device_whose_limits_are_the_consumed_capacity(
        dra_node: DraNode) -> None:
    claim = dra_node.claim("train", cores="30", memory="10Gi")
    uid = claim["metadata"]["uid"]
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"cores": "30", "memory": "10Gi"}

    answer = dra_node.kubelet.prepare(claim)[uid]

    assert answer.error == ""
    [device] = answer.devices
    assert (device.pool_name, device.device_name) == (NODE, result["device"])
    assert list(device.request_names) == ["gpu"]
    gpu = _gpu_of(claim)
    assert list(device.cdi_device_ids) == [f"nvidia.com/gpu={gpu}", f"vcuda.io/claim={uid}"]
    record = _record_dir(dra_node, uid)
    limits = contract.parse_limits((record / LIMITS_FILE).read_text())
    assert (limits.memory, limits.cores, limits.devices) == (10 * GIB, 30, (gpu,))
    assert limits.account == "/run/vcuda/account"
    assert (record / PRELOAD_FILE).read_text() == "/usr/local/vcuda/lib/libvcuda.so\n"
    edits = _spec(dra_node, uid)["devices"][0]["containerEdits"]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    # Node paths, as the runtime on the node opens them; directories where the paths allow.
    assert mounts["/etc/vcuda"]["hostPath"] == str(record)
    assert "ro" in mounts["/etc/vcuda"]["options"]
    assert mounts["/usr/local/vcuda/lib"]["hostPath"] == os.path.dirname(LIBRARY)
    assert mounts["/etc/ld.so.preload"]["hostPath"] == f"{record}/{PRELOAD_FILE}"
    assert mounts["/run/vcuda"]["hostPath"] == f"{record}/account"
    assert "rw" in mounts["/run/vcuda"]["options"]
    assert "env" not in edits  # the container's environment is the tenant's to change
    assert os.path.ismount(record / "account")
    entry = _record(dra_node, uid)
    assert entry is not None
    assert (entry.memory, entry.cores, entry.devices) == (10 * GIB, 30, (gpu,))


def test_prepare_and_unprepare_are_idempotent_and_unprepare_removes_everything(
        dra_node: DraNode) -> None:
    claim = dra_node.claim("serve", cores="20", memory="2Gi")
    uid = claim["metadata"]["uid"]
    first = dra_node.kubelet.prepare(claim)[uid]
    again = dra_node.kubelet.prepare(claim)[uid]
    assert again.error == "" and again.devices == first.devices
    assert [e.container_id for e in ledger.entries(_state(dra_node))] == [RECORD_PREFIX + uid]

    for _ in range(2):
        assert dra_node.kubelet.unprepare(claim)[uid].error == ""
    assert _record(dra_node, uid) is None
    assert not _spec_file(dra_node, uid).exists()
    assert not _record_dir(dra_node, uid).exists()


def test_one_call_prepares_several_claims_and_each_gets_its_own_answer(
        dra_node: DraNode) -> None:
    good = dra_node.claim("good", cores="10", memory="1Gi")
    gone = dict(dra_node.claim("gone", cores="10", memory="1Gi"))
    gone["metadata"] = {**gone["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}

    answers = dra_node.kubelet.prepare(good, gone)

    assert answers[good["metadata"]["uid"]].error == ""
    assert answers[gone["metadata"]["uid"]].error == (
        "vcuda: claim team-a/gone has UID " + repr(dra_node.api.get(
            "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/gone")["metadata"]["uid"])
        + ", kubelet asked for '00000000-0000-0000-0000-000000000000'; fix: the claim was "
        "deleted and created again: delete the pod")


def test_the_node_ledger_refuses_a_claim_that_does_not_fit_with_the_hooks_message(
        dra_node: DraNode) -> None:
    claim = dra_node.claim("big", cores="50", memory="12Gi")
    uid = claim["metadata"]["uid"]
    gpu = _gpu_of(claim)
    # A container the hook started on that GPU, which the scheduler's DRA view does not see.
    taken = 16 * GIB - 8 * GIB if gpu == GPU0 else 40 * GIB - 8 * GIB
    _commit(dra_node, "c0ffee", os.getpid(), taken, 20, gpu)

    answer = dra_node.kubelet.prepare(claim)[uid]

    index = 0 if gpu == GPU0 else 1
    capacity = "16.00 GiB (17179869184 bytes)" if gpu == GPU0 else "40.00 GiB (42949672960 bytes)"
    assert answer.error == (
        f"vcuda: claim team-a/big: GPU {gpu} (index {index}) has 8.00 GiB (8589934592 bytes) "
        f"free of {capacity} for shared containers, and this container asks for 12.00 GiB "
        "(12884901888 bytes); fix: the scheduler's view and the node differ (a container "
        "started by the hook holds that GPU): delete the pod so that it is placed again")
    assert list(answer.devices) == []
    assert _record(dra_node, uid) is None
    assert not _spec_file(dra_node, uid).exists()


def test_a_whole_gpu_claim_gets_the_gpu_alone_and_holds_all_its_memory(
        dra_node: DraNode) -> None:
    claim = dra_node.claim("whole")
    uid = claim["metadata"]["uid"]
    gpu = _gpu_of(claim)

    [device] = dra_node.kubelet.prepare(claim)[uid].devices

    assert list(device.cdi_device_ids) == [f"nvidia.com/gpu={gpu}"]
    assert not _spec_file(dra_node, uid).exists()
    entry = _record(dra_node, uid)
    assert entry is not None and entry.memory == (16 if gpu == GPU0 else 40) * GIB
    assert entry.cores == 100


def test_a_restarted_plugin_registers_again_and_finds_what_it_prepared(
        dra_node: DraNode, log: logging.Logger) -> None:
    claim = dra_node.claim("long", cores="40", memory="4Gi")
    uid = claim["metadata"]["uid"]
    before = dra_node.kubelet.prepare(claim)[uid]

    dra_node.restart(log)
    dra_node.kubelet.register()

    after = dra_node.kubelet.prepare(claim)[uid]
    assert after.error == "" and after.devices == before.devices
    assert len(ledger.entries(_state(dra_node))) == 1
    assert dra_node.kubelet.unprepare(claim)[uid].error == ""
    assert ledger.entries(_state(dra_node)) == []


def test_prepare_finishes_a_record_that_a_crashed_prepare_left_half_built(
        dra_node: DraNode) -> None:
    claim = dra_node.claim("crash", cores="25", memory="3Gi")
    uid = claim["metadata"]["uid"]
    # Committed, then killed before its files and mount.
    _commit(dra_node, RECORD_PREFIX + uid, 0, 3 * GIB, 25, _gpu_of(claim))

    answer = dra_node.kubelet.prepare(claim)[uid]

    assert answer.error == ""
    record = _record_dir(dra_node, uid)
    assert contract.parse_limits((record / LIMITS_FILE).read_text()).memory == 3 * GIB
    assert os.path.ismount(record / "account")


def test_a_prepared_claim_survives_the_hooks_release_of_gone_containers(
        dra_node: DraNode) -> None:
    claim = dra_node.claim("kept", cores="10", memory="1Gi")
    uid = claim["metadata"]["uid"]
    dra_node.kubelet.prepare(claim)
    state = _state(dra_node)
    with state.locked(5):
        assert state.release_gone() == []
    assert _record(dra_node, uid) is not None


def test_prepare_names_what_is_wrong_with_a_claim_it_cannot_prepare(dra_node: DraNode) -> None:
    claim = dra_node.claim("moved", cores="10", memory="1Gi")
    uid = claim["metadata"]["uid"]
    stored = dra_node.api.get("/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/moved")
    stored["status"]["allocation"]["devices"]["results"][0]["pool"] = "gpu-node-2"
    dra_node.api.add_claim(stored)
    device = stored["status"]["allocation"]["devices"]["results"][0]["device"]
    assert dra_node.kubelet.prepare(claim)[uid].error == (
        f"vcuda: claim team-a/moved: device {device} of pool 'gpu-node-2' is not on this node "
        f"(pool '{NODE}'); fix: delete the pod and its claim so that the scheduler allocates it "
        "again")

    del stored["status"]
    dra_node.api.add_claim(stored)
    assert dra_node.kubelet.prepare(claim)[uid].error == (
        "vcuda: claim team-a/moved has no allocation yet; fix: wait: kubelet prepares a claim "
        "once it is allocated")


def test_prepare_without_rbac_says_which_grant_is_missing(dra_node: DraNode) -> None:
    claim = dra_node.claim("denied", cores="10", memory="1Gi")
    dra_node.api.rules = []
    error = dra_node.kubelet.prepare(claim)[claim["metadata"]["uid"]].error
    assert error.startswith("vcuda: not allowed to get resourceclaim team-a/denied: "
                            'resourceclaims "denied" is forbidden: User '
                            '"system:serviceaccount:vcuda-system:vcuda-node" cannot get')
    assert error.endswith("; fix: grant it with manifests/dra/rbac.yaml (get resourceclaims; "
                          "get, create, update resourceslices) and manifests/base/node-rbac.yaml "
                          "(get nodes)")


def test_a_claim_uid_that_is_not_a_uuid_names_no_file(dra_node: DraNode) -> None:
    claim = dra_node.claim("odd", cores="10", memory="1Gi")
    odd = {"metadata": {**claim["metadata"], "uid": "../../state"}}
    refused = ("vcuda: claim UID '../../state' is not a UUID; fix: only kubelet may call the "
               "plugin")
    assert dra_node.kubelet.unprepare(odd)["../../state"].error == refused
    assert dra_node.kubelet.prepare(odd)["../../state"].error == refused
    assert dra_node.state_dir.is_dir()


def test_concurrent_prepares_on_one_gpu_commit_only_what_fits(dra_node: DraNode) -> None:
    # Six 2 GiB claims the scheduler placed on GPU0 (16 GiB, first fit); the node meanwhile
    # gave 10 GiB of it to a container the hook started: three fit, whatever the order.
    claims = [dra_node.claim(f"c{n}", cores="10", memory="2Gi") for n in range(6)]
    assert {_gpu_of(c) for c in claims} == {GPU0}
    _commit(dra_node, "c0ffee", os.getpid(), 10 * GIB, 10, GPU0)
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda c: dra_node.kubelet.prepare(c)[c["metadata"]["uid"]],
                                claims))
    assert sorted(bool(a.error) for a in answers) == [False] * 3 + [True] * 3
    assert all("has 0.00 GiB (0 bytes) free of 16.00 GiB" in a.error for a in answers if a.error)
    committed = ledger.committed(ledger.entries(_state(dra_node)))
    assert committed[GPU0] == (16 * GIB, 40)


def _tampered(node: DraNode, name: str, change: Callable[[dict], None]) -> dict:
    """A claim allocated as usual, then ``change``d in the API (its first result)."""
    claim = node.claim(name, cores="10", memory="1Gi")
    path = f"/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/{name}"
    stored = node.api.get(path)
    change(stored["status"]["allocation"]["devices"])
    node.api.add_claim(stored)
    return claim


def test_malformed_consumed_capacity_refuses_that_claim_alone_and_at_once(
        dra_node: DraNode) -> None:
    def consumed(value: object) -> Callable[[dict], None]:
        return lambda devices: devices["results"][0].update(consumedCapacity=value)

    def results(value: object) -> Callable[[dict], None]:
        return lambda devices: devices.update(results=value)

    good = dra_node.claim("good", cores="10", memory="1Gi")
    bad = {
        "nan": (consumed({"cores": "NaN"}), "consumed cores 'NaN' is not a whole number in "
                "1..100"),
        "inf": (consumed({"memory": "Infinity"}), "consumed memory 'Infinity' is not a whole "
                "number in 268435456..17179869184"),
        "float": (consumed({"memory": float("nan")}), "consumed memory nan is not a whole "
                  "number in 268435456..17179869184"),
        "huge": (consumed({"memory": "1e250000"}), "consumed memory '1e250000' is not a whole "
                 "number in 268435456..17179869184"),
        "long": (consumed({"cores": "1" * 5000}), "consumed cores '" + "1" * 79 + " is not a "
                 "whole number in 1..100"),
        "text": (consumed("10Gi"), "consumedCapacity is not an object"),
        "list": (results([42]), "its allocation's results are not a list of objects"),
        "scalar": (results("gpu"), "its allocation's results are not a list of objects"),
    }
    claims = {name: _tampered(dra_node, name, change) for name, (change, _) in bad.items()}
    started = time.monotonic()
    answers = dra_node.kubelet.prepare(good, *claims.values())
    assert time.monotonic() - started < 2.0  # no number is turned into a 250,000-digit int

    assert answers[good["metadata"]["uid"]].error == ""
    assert len(answers[good["metadata"]["uid"]].devices) == 1
    for name, (_, reason) in bad.items():
        error = answers[claims[name]["metadata"]["uid"]].error
        assert error.startswith(f"vcuda: claim team-a/{name}: "), error
        assert reason in error, error
        assert error.endswith("; fix: delete the pod and its claim so that the scheduler "
                              "allocates it again")
        assert _record(dra_node, claims[name]["metadata"]["uid"]) is None


def test_a_node_with_max_sharers_refuses_the_claim_past_its_cap_with_the_hooks_message(
        dra_node: DraNode) -> None:
    # The node's own preparer under --max-sharers 1, against the same ledger and GPUs.
    paths = Paths(host_root="/", state_dir=str(dra_node.state_dir),
                  cdi_dir=str(dra_node.cdi_dir), library=LIBRARY, account_mib=1)
    preparer = Preparer(paths, pool=NODE, sharing=Sharing(max_sharers=1))
    first = dra_node.claim("first", cores="10", memory="1Gi")
    second = dra_node.claim("second", cores="10", memory="1Gi")
    assert _gpu_of(first) == _gpu_of(second)  # the scheduler's first fit
    preparer.prepare(first["metadata"]["uid"], first)
    with pytest.raises(PrepareError) as refused:
        preparer.prepare(second["metadata"]["uid"], second)
    assert str(refused.value) == (
        f"claim team-a/second: GPU {_gpu_of(second)} (index 0) has 1 shared container, the "
        "most this node allows on one GPU (--max-sharers 1)")
    assert _record(dra_node, second["metadata"]["uid"]) is None
    preparer.unprepare(first["metadata"]["uid"])


def test_a_claim_for_two_shares_lists_both_gpus_in_one_limits_file_and_one_record(
        dra_node: DraNode) -> None:
    # One request with count 2 (not two requests): every share of a claim consumes the same
    # cores and memory, since one limits file serves each container that uses the claim.
    claim = dra_node.claim("tp", cores="40", memory="4Gi", count=2)
    uid = claim["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    gpus = tuple(GPU0 if r["device"] == device_name(GPU0) else GPU1 for r in results)
    assert sorted(gpus) == sorted((GPU0, GPU1))  # two distinct GPUs of the node
    answer = dra_node.kubelet.prepare(claim)[uid]
    assert answer.error == ""
    assert len(answer.devices) == 2
    limits = contract.parse_limits((_record_dir(dra_node, uid) / LIMITS_FILE).read_text())
    assert (limits.memory, limits.cores, limits.devices) == (4 * GIB, 40, gpus)
    entry = _record(dra_node, uid)
    assert entry is not None and entry.devices == gpus
