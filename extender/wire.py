"""kube-scheduler's extender API v1 on the wire: the arguments of filter, prioritize and bind,
and their answers, as ``k8s.io/kube-scheduler/extender/v1`` puts them on the wire.

Those Go types carry no JSON tags, so kube-scheduler's ``encoding/json`` writes the Go field
names (``Pod``, ``NodeNames``, ``PodName``, ...), and reads answers matching keys without regard to
case. Requests are read under those names, and under the lower-case ones of the older tagged
types (``pod``, ``nodenames``, ``podName``, ...), which Go's decoder accepts alike; answers use
the Go field names. The Pod inside has its usual names.

The extender is configured ``nodeCacheCapable: true``: the scheduler sends the candidate nodes'
names (``NodeNames``), not the Node objects, and takes back the names kept (``NodeNames`` of
the filter result; a name it did not send is an error there). The extender reads the nodes from
its own view (:mod:`extender.nodes`). Arguments with ``Nodes`` and no ``NodeNames`` come from a
scheduler configured ``nodeCacheCapable: false``, and are refused with what to change.
"""

from __future__ import annotations

from typing import Any

import msgspec

from extender.errors import ExtenderError
from webhook.json_errors import DECODE_ERRORS, misfit, why_refused


class BadArguments(ExtenderError, ValueError):
    """The body is not what kube-scheduler sends (HTTP 400); the message says what is wrong."""


class _ExtenderArgs(msgspec.Struct, frozen=True):
    pod: dict[str, Any] | None = msgspec.field(default=None, name="Pod")
    nodes: Any = msgspec.field(default=None, name="Nodes")  # sent by nodeCacheCapable: false
    node_names: list[str] | None = msgspec.field(default=None, name="NodeNames")
    old_pod: dict[str, Any] | None = msgspec.field(default=None, name="pod")
    old_nodes: Any = msgspec.field(default=None, name="nodes")
    old_node_names: list[str] | None = msgspec.field(default=None, name="nodenames")


class ExtenderArgs(msgspec.Struct, frozen=True):
    """The arguments of filter and prioritize: the pod, and the candidate nodes' names in
    order."""

    pod: dict[str, Any]
    names: list[str]


class BindingArgs(msgspec.Struct, frozen=True):
    """ExtenderBindingArgs: the pod to bind and the node chosen."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


class _BindingArgs(msgspec.Struct, frozen=True):
    pod_name: str = msgspec.field(default="", name="PodName")
    pod_namespace: str = msgspec.field(default="", name="PodNamespace")
    pod_uid: str = msgspec.field(default="", name="PodUID")
    node: str = msgspec.field(default="", name="Node")
    old_pod_name: str = msgspec.field(default="", name="podName")
    old_pod_namespace: str = msgspec.field(default="", name="podNamespace")
    old_pod_uid: str = msgspec.field(default="", name="podUID")
    old_node: str = msgspec.field(default="", name="node")


class _Resources(msgspec.Struct, frozen=True):
    limits: dict[str, str] | None = None  # quantities are strings on the wire


class _Container(msgspec.Struct, frozen=True):
    name: str = ""
    restart_policy: str | None = msgspec.field(default=None, name="restartPolicy")
    resources: _Resources | None = None


class _Spec(msgspec.Struct, frozen=True):
    containers: list[_Container] | None = None
    init_containers: list[_Container] | None = msgspec.field(default=None,
                                                             name="initContainers")


class _PodMeta(msgspec.Struct, frozen=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    version: str | None = msgspec.field(default=None, name="resourceVersion")
    annotations: dict[str, str] | None = None


class _Pod(msgspec.Struct, frozen=True):
    """The fields of a Pod that the extender reads, with the types the API server gives them:
    a pod sent with others is not one kube-scheduler sends."""

    metadata: _PodMeta
    spec: _Spec


_decode_args = msgspec.json.Decoder(_ExtenderArgs).decode
_decode_binding = msgspec.json.Decoder(_BindingArgs).decode
_encode = msgspec.json.Encoder().encode


def parse_args(body: bytes) -> ExtenderArgs:
    """Read ExtenderArgs; raise BadArguments unless it has a pod and node names."""
    try:
        args = _decode_args(body)
    except DECODE_ERRORS:
        why = why_refused(body, _ExtenderArgs, "ExtenderArgs")
        raise BadArguments(f"not ExtenderArgs: {why}") from None
    pod = args.pod if args.pod is not None else args.old_pod
    names = args.node_names if args.node_names is not None else args.old_node_names
    if not pod:
        raise BadArguments("ExtenderArgs without a pod: the body needs \"Pod\"")
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(pod.get("spec"), dict):
        raise BadArguments("ExtenderArgs.Pod has no metadata or spec object")
    try:
        msgspec.convert(pod, _Pod)
    except msgspec.ValidationError:
        where = misfit(pod, _Pod, "ExtenderArgs.Pod") or "its fields have other types"
        raise BadArguments(f"ExtenderArgs.Pod is not a Pod as the API server holds it: {where}") \
            from None
    if names is None:
        if args.nodes is not None or args.old_nodes is not None:
            raise BadArguments("ExtenderArgs has Nodes and no NodeNames: configure this "
                               "extender with nodeCacheCapable: true in the scheduler's "
                               "extenders, so the scheduler sends node names")
        raise BadArguments("ExtenderArgs without node names: the body needs \"NodeNames\": "
                           "[...]")
    for index, name in enumerate(names):
        if not name:
            raise BadArguments(f"ExtenderArgs.NodeNames[{index}] is empty")
    return ExtenderArgs(pod, names)


def parse_binding(body: bytes) -> BindingArgs:
    """Read ExtenderBindingArgs; raise BadArguments naming a missing or wrong field."""
    try:
        sent = _decode_binding(body)
    except DECODE_ERRORS:
        raise BadArguments("not ExtenderBindingArgs: "
                           f"{why_refused(body, _BindingArgs, 'ExtenderBindingArgs')}") from None
    args = BindingArgs(sent.pod_name or sent.old_pod_name,
                       sent.pod_namespace or sent.old_pod_namespace,
                       sent.pod_uid or sent.old_pod_uid, sent.node or sent.old_node)
    for field, value in (("PodName", args.pod_name), ("PodNamespace", args.pod_namespace),
                         ("PodUID", args.pod_uid), ("Node", args.node)):
        if not value:
            raise BadArguments(f"ExtenderBindingArgs.{field} is empty")
    return args


def filter_result(kept: list[str], failed: dict[str, str],
                  unresolvable: dict[str, str]) -> bytes:
    """ExtenderFilterResult: the names of the nodes kept, and why each other one failed."""
    result: dict[str, Any] = {"NodeNames": kept}
    if failed:
        result["FailedNodes"] = failed
    if unresolvable:
        result["FailedAndUnresolvableNodes"] = unresolvable
    return _encode(result)


def priority_list(scores: list[tuple[str, int]]) -> bytes:
    """HostPriorityList: one ``{"Host", "Score"}`` per node."""
    return _encode([{"Host": host, "Score": score} for host, score in scores])


def binding_result(error: str = "") -> bytes:
    """ExtenderBindingResult: empty on success, else the error the pod's events show."""
    return _encode({"Error": error} if error else {})
