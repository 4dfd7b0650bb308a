"""The extender's JSON against the upstream types of ``k8s.io/kube-scheduler/extender/v1``.

Those Go types have no JSON tags, so kube-scheduler's ``encoding/json`` writes each field under
its Go name, and reads answers matching names without regard to case. The field names below
are the upstream ones (types.go of that package); older schedulers used tagged copies with
lower-case names (``pod``, ``nodes``, ``nodenames``, ``podName``, ...).
"""

from __future__ import annotations

import json

import pytest

from extender.wire import (
    BadArguments,
    binding_result,
    filter_result,
    parse_args,
    parse_binding,
    priority_list,
)
from tests.extender.cluster import GIB, node_object, pod_object

UPSTREAM = {
    "ExtenderArgs": ("Pod", "Nodes", "NodeNames"),
    "ExtenderFilterResult": ("Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
                             "Error"),
    "ExtenderBindingArgs": ("PodName", "PodNamespace", "PodUID", "Node"),
    "ExtenderBindingResult": ("Error",),
    "HostPriority": ("Host", "Score"),
}


def test_extender_args_as_kube_scheduler_marshals_them_with_a_node_cache_are_read() -> None:
    # nodeCacheCapable: true: NodeNames set, Nodes a nil pointer (null).
    pod = pod_object("p", 10, 1)
    body = json.dumps(dict(zip(UPSTREAM["ExtenderArgs"], (pod, None, ["a", "b"])))).encode()
    args = parse_args(body)
    assert args.pod == pod
    assert args.names == ["a", "b"]


def test_extender_args_of_the_older_tagged_types_are_read_too() -> None:
    pod = pod_object("p", 10, 1)
    args = parse_args(json.dumps({"pod": pod, "nodenames": ["n"]}).encode())
    assert args.pod == pod and args.names == ["n"]


def test_extender_args_with_whole_nodes_say_to_configure_the_node_cache() -> None:
    # nodeCacheCapable: false: Nodes set, NodeNames a nil pointer (null).
    pod, node = pod_object("p", 10, 1), node_object("n", [GIB])
    body = json.dumps(dict(zip(UPSTREAM["ExtenderArgs"], (pod, {"metadata": {}, "items": [node]},
                                                          None)))).encode()
    with pytest.raises(BadArguments, match="configure this extender with nodeCacheCapable: true"):
        parse_args(body)


def test_binding_args_as_kube_scheduler_marshals_them_are_read() -> None:
    body = json.dumps(dict(zip(UPSTREAM["ExtenderBindingArgs"], ("p", "team", "uid-1", "n"))))
    args = parse_binding(body.encode())
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == (
        "p", "team", "uid-1", "n")
    older = parse_binding(b'{"podName": "p", "podNamespace": "team", "podUID": "u", "node": "n"}')
    assert (older.pod_name, older.pod_uid, older.node) == ("p", "u", "n")


@pytest.mark.parametrize("missing", UPSTREAM["ExtenderBindingArgs"])
def test_binding_args_without_a_field_name_it(missing: str) -> None:
    body = {name: "x" for name in UPSTREAM["ExtenderBindingArgs"] if name != missing}
    with pytest.raises(BadArguments, match=f"ExtenderBindingArgs.{missing} is empty"):
        parse_binding(json.dumps(body).encode())


def test_answers_use_only_the_upstream_field_names() -> None:
    filtered = json.loads(filter_result(["n"], {"a": "full"}, {"b": "stale"}))
    assert set(filtered) == set(UPSTREAM["ExtenderFilterResult"]) - {"Nodes", "Error"}
    assert filtered == {"NodeNames": ["n"], "FailedNodes": {"a": "full"},
                        "FailedAndUnresolvableNodes": {"b": "stale"}}
    assert json.loads(filter_result([], {}, {})) == {"NodeNames": []}  # none kept: not null
    scores = json.loads(priority_list([("n", 7)]))
    assert scores == [dict(zip(UPSTREAM["HostPriority"], ("n", 7)))]
    assert json.loads(binding_result("no room")) == {"Error": "no room"}
    assert set(json.loads(binding_result("x"))) == set(UPSTREAM["ExtenderBindingResult"])
    assert json.loads(binding_result()) == {}
