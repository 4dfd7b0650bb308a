"""kube-scheduler's extender API v1 on the wire: the arguments of filter, prioritize and bind,
and their answers, as ``k8s.io/kube-scheduler/extender/v1`` puts them on the wire.

Those Go types carry no JSON tags, so kube-scheduler's ``encoding/json`` writes the Go field
names (``Pod``, ``Nodes``, ``PodName``, ...), and reads answers matching keys without regard to
case. Requests are read under those names, and under the lower-case ones of the older tagged
types (``pod``, ``nodes``, ``nodenames``, ``podName``, ...), which Go's decoder accepts alike;
answers use the Go field names. The Kubernetes objects inside (Pod, NodeList) have their
usual names.

The scheduler sends whole Node objects (``nodeCacheCapable: false``); only their names and
annotations are decoded, and filter answers the objects it keeps byte for byte as they came.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

import msgspec

from extender.errors import ExtenderError


class BadArguments(ExtenderError, ValueError):
    """The body is not what kube-scheduler sends (HTTP 400); the message says what is wrong."""


_Item = TypeVar("_Item")  # how the nodes are read: whole (msgspec.Raw) or their heads only


class _Meta(msgspec.Struct, frozen=True):
    name: str = ""
    annotations: dict[str, str] | None = None


class NodeHead(msgspec.Struct, frozen=True):
    """What the extender reads of a Node: its name and annotations."""

    metadata: _Meta = _Meta()


class _NodeList(msgspec.Struct, Generic[_Item], frozen=True):
    items: list[_Item] | None = None


class _ExtenderArgs(msgspec.Struct, Generic[_Item], frozen=True):
    pod: dict[str, Any] | None = msgspec.field(default=None, name="Pod")
    nodes: _NodeList[_Item] | None = msgspec.field(default=None, name="Nodes")
    node_names: list[str] | None = msgspec.field(default=None, name="NodeNames")
    old_pod: dict[str, Any] | None = msgspec.field(default=None, name="pod")
    old_nodes: _NodeList[_Item] | None = msgspec.field(default=None, name="nodes")
    old_node_names: list[str] | None = msgspec.field(default=None, name="nodenames")


class ExtenderArgs(msgspec.Struct, frozen=True):
    """The arguments of filter and prioritize: the pod, and the candidate nodes in order (and
    as they came, if asked for)."""

    pod: dict[str, Any]
    nodes: list[NodeHead]
    raw_nodes: list[msgspec.Raw]


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


_decode_args = msgspec.json.Decoder(_ExtenderArgs[msgspec.Raw]).decode
_decode_heads = msgspec.json.Decoder(_ExtenderArgs[NodeHead]).decode
_decode_node = msgspec.json.Decoder(NodeHead).decode
_decode_binding = msgspec.json.Decoder(_BindingArgs).decode
_encode = msgspec.json.Encoder().encode


def parse_args(body: bytes, whole: bool = True) -> ExtenderArgs:
    """Read ExtenderArgs; raise BadArguments unless it has a pod and nodes (not node names).

    ``whole``: keep each node as it came (``raw_nodes``), for filter's answer; without it
    (prioritize) the body is read in one pass and ``raw_nodes`` is empty.
    """
    try:
        args = (_decode_args if whole else _decode_heads)(body)
    except msgspec.DecodeError as exc:
        raise BadArguments(f"not ExtenderArgs: {exc}") from None
    pod = args.pod if args.pod is not None else args.old_pod
    nodes = args.nodes if args.nodes is not None else args.old_nodes
    if not pod:
        raise BadArguments("ExtenderArgs without a pod: the body needs \"Pod\"")
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(pod.get("spec"), dict):
        raise BadArguments("ExtenderArgs.Pod has no metadata or spec object")
    if nodes is None:
        if args.node_names is not None or args.old_node_names is not None:
            raise BadArguments("ExtenderArgs has NodeNames only: configure this extender with "
                               "nodeCacheCapable: false, so the scheduler sends the nodes")
        raise BadArguments("ExtenderArgs without nodes: the body needs \"Nodes\": {\"items\": "
                           "[...]}")
    items = nodes.items or []
    if whole:
        raw = cast("list[msgspec.Raw]", items)
        try:
            heads = [_decode_node(item) for item in raw]
        except msgspec.DecodeError as exc:
            raise BadArguments(f"ExtenderArgs.Nodes.items: {exc}") from None
    else:
        raw, heads = [], cast("list[NodeHead]", items)
    for index, head in enumerate(heads):
        if not head.metadata.name:
            raise BadArguments(f"ExtenderArgs.Nodes.items[{index}] has no metadata.name")
    return ExtenderArgs(pod, heads, raw)


def parse_binding(body: bytes) -> BindingArgs:
    """Read ExtenderBindingArgs; raise BadArguments naming a missing or wrong field."""
    try:
        sent = _decode_binding(body)
    except msgspec.DecodeError as exc:
        raise BadArguments(f"not ExtenderBindingArgs: {exc}") from None
    args = BindingArgs(sent.pod_name or sent.old_pod_name,
                       sent.pod_namespace or sent.old_pod_namespace,
                       sent.pod_uid or sent.old_pod_uid, sent.node or sent.old_node)
    for field, value in (("PodName", args.pod_name), ("PodNamespace", args.pod_namespace),
                         ("PodUID", args.pod_uid), ("Node", args.node)):
        if not value:
            raise BadArguments(f"ExtenderBindingArgs.{field} is empty")
    return args


def filter_result(kept: list[msgspec.Raw], failed: dict[str, str],
                  unresolvable: dict[str, str], error: str = "") -> bytes:
    """ExtenderFilterResult: the nodes kept (as they came), and why each other one failed."""
    result: dict[str, Any] = {"Nodes": {"items": kept}}
    if failed:
        result["FailedNodes"] = failed
    if unresolvable:
        result["FailedAndUnresolvableNodes"] = unresolvable
    if error:
        result["Error"] = error
    return _encode(result)


def priority_list(scores: list[tuple[str, int]]) -> bytes:
    """HostPriorityList: one ``{"Host", "Score"}`` per node."""
    return _encode([{"Host": host, "Score": score} for host, score in scores])


def binding_result(error: str = "") -> bytes:
    """ExtenderBindingResult: empty on success, else the error the pod's events show."""
    return _encode({"Error": error} if error else {})
