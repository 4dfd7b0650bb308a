"""The scheduling benchmark's offline checks find each fault they count, from objects alone:
GPUs given out beyond their time or memory, shared and whole at once, pods that wait although
a GPU could hold them, bound pods without an assignment."""

from __future__ import annotations

from typing import Any

from runtime_hook.contract import ASSIGNMENT_ANNOTATION
from runtime_hook.placement import Assignment, encode_assignment
from tests.cluster import final_state
from tests.cluster.simulated import Pod, node_gpus, node_name, node_object, node_slice
from tests.extender.cluster import GIB


def _bound(name: str, assignment: Assignment | None) -> dict[str, Any]:
    annotations = {ASSIGNMENT_ANNOTATION: encode_assignment(assignment)} if assignment else {}
    return {"metadata": {"name": name, "annotations": annotations},
            "spec": {"nodeName": node_name(0)}}


def _pending(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {}}


def test_assignments_beyond_a_gpu_shared_and_whole_and_missing_are_each_counted() -> None:
    gpus = [g.uuid for g in node_gpus(0)]
    pods = [_bound("a", Assignment((gpus[0], 60, GIB), ())),
            _bound("b", Assignment((gpus[0], 50, GIB), ())),  # 110 percent of GPU 0
            _bound("c", Assignment(None, (gpus[1],))),
            _bound("d", Assignment((gpus[1], 10, GIB), ())),  # beside a whole holder
            _bound("e", None),
            _pending("f")]
    asks = {"f": Pod("f", 10, 2)}
    found = final_state.by_assignments([node_object(0, 0)], pods, asks)
    assert found == {"over_committed_gpus": 1, "shared_and_whole_gpus": 1,
                     "pending_with_room": 1, "bound_without_assignment": 1}


def test_a_pending_pod_with_no_gpu_that_could_hold_it_is_not_a_fault() -> None:
    gpus = [g.uuid for g in node_gpus(1)]  # 8 GPUs of 48 GiB
    pods = [_bound(f"w{k}", Assignment(None, (gpus[k],))) for k in range(7)]
    pods.append(_pending("two"))
    for node in pods[:-1]:
        node["spec"]["nodeName"] = node_name(1)
    found = final_state.by_assignments([node_object(1, 0)], pods, {"two": Pod("two", whole=2)})
    assert found["pending_with_room"] == 0  # one GPU is free, it asks two


def test_claims_beyond_a_device_and_a_pending_share_with_room_are_counted() -> None:
    piece = node_slice(0, "uid")
    device = piece["spec"]["devices"][0]["name"]

    def claim(cores: str, memory: str) -> dict[str, Any]:
        result = {"pool": node_name(0), "device": device,
                  "consumedCapacity": {"cores": cores, "memory": memory}}
        return {"metadata": {}, "status": {"allocation": {"devices": {"results": [result]}}}}
    found = final_state.by_claims([piece], [claim("60", "10Gi"), claim("50", "10Gi")],
                                  [_pending("p")], {"p": Pod("p", whole=1)})
    assert found == {"over_committed_gpus": 1, "shared_and_whole_gpus": 0,
                     "pending_with_room": 1}

