"""What one node's annotations, or a pod of an odd shape, can do to the extender as
kube-scheduler calls it: the real server against the fake API server. A node its agent broke
(or an attacker holding it) takes only itself out, with the reason, logged once per content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime_hook.contract import INVENTORY_ANNOTATION, LEDGER_ANNOTATION, SHARED_RESOURCE
from tests.extender.cluster import (
    GIB,
    NOW,
    RunningExtender,
    binding_args,
    extender_args,
    gpu_uuid,
    node_object,
    pod_object,
)
from tests.extender.test_extender import add, bind, filtered
from tests.fake_cluster_api import FakeClusterApi
from tests.json_log import written_entries


def _ledger(item: dict[str, Any]) -> str:
    return json.dumps({"version": 1, "pods": {"uid-x": {"pod": "team/x", "at": int(NOW)} | item}})


def _inventory(gpus: Any, heartbeat: Any = int(NOW)) -> str:
    return json.dumps({"version": 1, "heartbeat": heartbeat, "gpus": gpus})


_DEEP = "[" * 60_000 + "]" * 60_000
_GPU = [{"uuid": gpu_uuid("bad", 0), "index": 0, "memory": 16 * GIB}]

# (annotations of the bad node, what its reason starts with)
HOSTILE = {
    "ledger memory 2^63": ({LEDGER_ANNOTATION: _ledger(
        {"shared": [gpu_uuid("bad", 0), 10, 1 << 63]})},
        "vcuda.io/gpu-ledger is malformed: shared bytes a number of 64 bits is not a whole "
        "number in 1..1125899906842624"),
    "ledger cores 2^64": ({LEDGER_ANNOTATION: _ledger(
        {"shared": [gpu_uuid("bad", 0), 1 << 64, GIB]})},
        "vcuda.io/gpu-ledger is malformed: shared cores a number of 65 bits is not a whole "
        "number in 1..99"),
    "ledger nested 60,000 deep": ({LEDGER_ANNOTATION: _DEEP},
                                  "vcuda.io/gpu-ledger is nested too deep to be read"),
    "inventory nested 60,000 deep": ({INVENTORY_ANNOTATION: _DEEP},
                                     "vcuda.io/gpus has 120000 characters, more than the 65536"),
    "inventory nested 20,000 deep": ({INVENTORY_ANNOTATION: "[" * 20_000 + "]" * 20_000},
                                     "vcuda.io/gpus is nested too deep to be read"),
    "heartbeat of 400 digits": ({INVENTORY_ANNOTATION: _inventory(_GPU, 10 ** 400)},
                                "vcuda.io/gpus is malformed: heartbeat a number of 1329 bits"),
    "heartbeat of 5,000 digits": ({INVENTORY_ANNOTATION: _inventory(_GPU, "HB").replace(
        '"HB"', "9" * 5000)}, "vcuda.io/gpus is not JSON: Exceeds the limit (4300 digits)"),
    "GPU memory of 10^30": ({INVENTORY_ANNOTATION: _inventory(
        [_GPU[0] | {"memory": 10 ** 30}])}, "vcuda.io/gpus is malformed: memory a number of"),
    "negative memory": ({INVENTORY_ANNOTATION: _inventory([_GPU[0] | {"memory": -1}])},
                        "vcuda.io/gpus is malformed: memory -1 is not a whole number"),
    "memory a float": ({INVENTORY_ANNOTATION: _inventory([_GPU[0] | {"memory": 1.5e10}])},
                       "vcuda.io/gpus is malformed: memory 15000000000.0 is not a whole"),
    "heartbeat NaN": ({INVENTORY_ANNOTATION: '{"version": 1, "heartbeat": NaN, "gpus": []}'},
                      "vcuda.io/gpus is malformed: heartbeat nan is not a whole number"),
    "UUID a lone surrogate": ({INVENTORY_ANNOTATION: _inventory(
        [_GPU[0] | {"uuid": "\ud800"}])},
        "vcuda.io/gpus is malformed: UUID '\\ud800' is not 1..128 printable ASCII"),
    "UUID with a newline": ({INVENTORY_ANNOTATION: _inventory([_GPU[0] | {"uuid": "GPU-a\n"}])},
                            "vcuda.io/gpus is malformed: UUID 'GPU-a\\n' is not"),
    "index 10^6": ({INVENTORY_ANNOTATION: _inventory([_GPU[0] | {"index": 10 ** 6}])},
                   "vcuda.io/gpus is malformed: index 1000000 is not a whole number in 0..255"),
    "GPU a list": ({INVENTORY_ANNOTATION: _inventory([[1, 2]])},
                   "vcuda.io/gpus is malformed: GPU [1, 2] is not an object"),
    "257 GPUs": ({INVENTORY_ANNOTATION: _inventory(
        [{"uuid": f"G{i}", "index": 0, "memory": GIB} for i in range(257)])},
        "vcuda.io/gpus is malformed: gpus is not a list of at most 256 GPUs"),
    "ledger at 'soon'": ({LEDGER_ANNOTATION: _ledger({"at": "soon"})},
                         "vcuda.io/gpu-ledger is malformed: at 'soon' is not a whole number"),
    "ledger entry a number": ({LEDGER_ANNOTATION: '{"version": 1, "pods": {"u": 5}}'},
                              "vcuda.io/gpu-ledger is malformed: the entry of 'u' is not an"),
    "ledger whole a string": ({LEDGER_ANNOTATION: _ledger({"whole": "GPU-bad-0"})},
                              "vcuda.io/gpu-ledger is malformed: whole is not a list"),
    "ledger pod a number": ({LEDGER_ANNOTATION: _ledger({"pod": 7})},
                            "vcuda.io/gpu-ledger is malformed: pod 7 of 'uid-x' is not a pod"),
    "ledger uid a lone surrogate": ({LEDGER_ANNOTATION: json.dumps(
        {"version": 1, "pods": {"\ud800": {"pod": "team/x", "at": 1}}})},
        "vcuda.io/gpu-ledger is malformed: the entry of '\\ud800' is not an object of a"),
    "ledger pod with a space": ({LEDGER_ANNOTATION: _ledger({"pod": "team/a b"})},
                                "vcuda.io/gpu-ledger is malformed: pod 'team/a b' of 'uid-x'"),
    "version a list": ({INVENTORY_ANNOTATION: '{"version": [1], "heartbeat": 1, "gpus": []}'},
                       "vcuda.io/gpus has version [1]; this vcuda reads version 1"),
}


def _bad_node(annotations: dict[str, str]) -> dict[str, Any]:
    node = node_object("bad", [16 * GIB])
    node["metadata"]["annotations"].update(annotations)
    return node


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_node_with_hostile_annotations_leaves_only_itself_out_with_the_reason(
        extender: RunningExtender, api: FakeClusterApi, case: str, tmp_path: Path) -> None:
    annotations, reason = HOSTILE[case]
    add(api, node_object("good", [16 * GIB]), _bad_node(annotations))
    pod = pod_object("p", cores=10, memory_gib=1)
    for _ in range(3):  # the scheduler asks pod after pod: one log line
        result = filtered(extender, api, pod, ["bad", "good"])
        assert result["NodeNames"] == ["good"]
        assert result["FailedAndUnresolvableNodes"]["bad"].startswith(reason)
        assert result["FailedAndUnresolvableNodes"]["bad"].endswith(
            ": check the vcuda node agent of this node")
        assert len(result["FailedAndUnresolvableNodes"]["bad"]) < 300
        scores = filtered(extender, api, pod, ["bad", "good"], "/prioritize")
        assert {s["Host"]: s["Score"] for s in scores}["bad"] == 0
    add(api, _bad_node(annotations))  # written again, the same values: not logged again
    assert filtered(extender, api, pod, ["bad", "good"])["NodeNames"] == ["good"]
    logged = [line for line in written_entries(tmp_path / "extender.log")
              if line["event"] == "node_unreadable"]
    assert [(line["node"], line["reason"][:len(reason)]) for line in logged] == [("bad", reason)]


def test_a_bind_on_a_node_whose_ledger_says_at_soon_fails_with_the_reason(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, _bad_node({LEDGER_ANNOTATION: _ledger({"at": "soon"})}))
    pod = add(api, pod_object("p", cores=10, memory_gib=1))[0]
    assert bind(extender, pod, "bad").startswith(
        "node bad: vcuda.io/gpu-ledger is malformed: at 'soon' is not a whole number")


def test_an_inventory_published_at_the_bounds_is_read(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    longest = "MIG-" + "f" * 124
    gpus = [{"uuid": f"{longest[:-3]}{i:03d}", "index": i, "memory": 1 << 50}
            for i in range(256)]
    text = _inventory(gpus)
    assert len(text) <= 64 << 10  # MAX_INVENTORY_CHARS
    add(api, _bad_node({INVENTORY_ANNOTATION: text}))
    assert filtered(extender, api, pod_object("p", 10, 1), ["bad"])["NodeNames"] == ["bad"]


def _shaped(change: Any) -> dict[str, Any]:
    pod = pod_object("p", cores=10, memory_gib=1)
    change(pod)
    return pod


_AT = "ExtenderArgs.Pod."
_LIMIT = '["docker.com/vcuda-core"]'
MALFORMED_PODS = {
    "containers a number": (lambda pod: pod["spec"].update(containers=5),
                            f"{_AT}spec.containers is a number, where a list or null belongs"),
    "a container a string": (lambda pod: pod["spec"].update(containers=["share"]),
                             f"{_AT}spec.containers[0] is a string, where an object belongs"),
    "limits a list": (lambda pod: pod["spec"]["containers"][0]["resources"].update(limits=[1]),
                      f"{_AT}spec.containers[0].resources.limits is a list, where an object or "
                      "null belongs"),
    "a limit a number": (lambda pod: pod["spec"]["containers"][0]["resources"]["limits"].update(
        {"docker.com/vcuda-core": 10}),
        f"{_AT}spec.containers[0].resources.limits{_LIMIT} is a number, where a string belongs"),
    "vcuda.io/limits a number": (lambda pod: pod["metadata"]["annotations"].update(
        {"vcuda.io/limits": 5}),
        f'{_AT}metadata.annotations["vcuda.io/limits"] is a number, where a string belongs'),
    "annotations a list": (lambda pod: pod["metadata"].update(annotations=[]),
                           f"{_AT}metadata.annotations is a list, where an object or null "
                           "belongs"),
    "a container's name an object": (lambda pod: pod["spec"]["containers"][0].update(
        name={"a": 1}), f"{_AT}spec.containers[0].name is an object, where a string belongs"),
    "initContainers an object": (lambda pod: pod["spec"].update(initContainers={}),
                                 f"{_AT}spec.initContainers is an object, where a list or null "
                                 "belongs"),
}


@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
@pytest.mark.parametrize("case", list(MALFORMED_PODS))
def test_a_pod_of_a_shape_the_api_server_never_stores_gets_400_with_where(
        extender: RunningExtender, api: FakeClusterApi, verb: str, case: str) -> None:
    change, where = MALFORMED_PODS[case]
    add(api, node_object("n", [16 * GIB]))
    extender.sync(api)
    status, payload = extender.post(verb, extender_args(_shaped(change), ["n"]))
    assert status == 400
    assert payload.decode().startswith(
        "bad extender request: ExtenderArgs.Pod is not a Pod as the API server holds it: ")
    assert where in payload.decode()


@pytest.mark.parametrize("limit", ["1e3", "-100", "1_00", " 100", "9" * 5000, "²"])
def test_a_gpu_limit_that_is_not_plain_digits_fails_every_node_with_what_to_do(
        extender: RunningExtender, api: FakeClusterApi, limit: str) -> None:
    add(api, node_object("n", [16 * GIB]))
    pod = pod_object("p", whole=1)
    pod["spec"]["containers"][0]["resources"]["limits"]["docker.com/vcuda-core"] = limit
    result = filtered(extender, api, pod, ["n"])
    assert result["FailedAndUnresolvableNodes"] == {"n": (
        'container "whole": its GPU limit is not a whole number; the vcuda webhook should '
        "have denied it: is it installed?")}


def test_a_pod_asking_for_the_shared_gpu_resource_itself_passes_no_node(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    pod = pod_object("p")
    pod["spec"]["containers"][0]["resources"]["limits"] = {SHARED_RESOURCE: "1"}
    result = filtered(extender, api, pod, ["n"])
    assert result["NodeNames"] == []
    assert result["FailedAndUnresolvableNodes"]["n"].startswith(
        'container "plain" asks for vcuda.io/shared-gpu itself: a share is asked for as '
        "docker.com/vcuda-core and its memory")
    added = add(api, pod)[0]
    assert bind(extender, added, "n").startswith('container "plain" asks for vcuda.io/shared-gpu')


def test_a_share_of_more_memory_than_any_gpu_has_fails_every_node_with_what_to_do(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    pod = pod_object("p", cores=10, memory_gib=1)
    pod["metadata"]["annotations"]["vcuda.io/limits"] = json.dumps(
        {"share": {"cores": 10, "memory": 10 ** 400}})
    result = filtered(extender, api, pod, ["n"])
    assert result["FailedAndUnresolvableNodes"]["n"].startswith(
        "the pod's shared containers ask for more memory of one GPU together than any GPU has "
        "(1 PiB)")


def test_a_bind_args_of_the_right_shape_with_an_unknown_pod_is_refused_not_500(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    pod = pod_object("ghost", 10, 1)  # never created
    status, payload = extender.post("/bind", binding_args(pod, "n"))
    assert status == 200
    assert json.loads(payload)["Error"].startswith("cannot read pod team/ghost")
