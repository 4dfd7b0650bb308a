"""kube-scheduler's extender API v1 on the wire: the arguments of filter, prioritize and bind,
and their answers, with the JSON field names of ``k8s.io/kube-scheduler/extender/v1``.

The scheduler sends whole Node objects (``nodeCacheCapable: false``); only their names and
annotations are decoded, and filter answers the objects it keeps byte for byte as they came.
"""

from __future__ import annotations

from typing import Any

import msgspec

from extender.errors import ExtenderError


class BadArguments(ExtenderError, ValueError):
    """The body is not what kube-scheduler sends (HTTP 400); the message says what is wrong."""


class _Meta(msgspec.Struct, frozen=True):
    name: str = ""
    annotations: dict[str, str] | None = None


class NodeHead(msgspec.Struct, frozen=True):
    """What the extender reads of a Node: its name and annotations."""

    metadata: _Meta = _Meta()


class _NodeList(msgspec.Struct, frozen=True):
    items: list[msgspec.Raw] | None = None


class _ExtenderArgs(msgspec.Struct, frozen=True):
    pod: dict[str, Any] | None = None
    nodes: _NodeList | None = None
    nodenames: list[str] | None = None


class ExtenderArgs(msgspec.Struct, frozen=True):
    """The arguments of filter and prioritize: the pod, and the candidate nodes in order."""

    pod: dict[str, Any]
    nodes: list[NodeHead]
    raw_nodes: list[msgspec.Raw]


class BindingArgs(msgspec.Struct, frozen=True, rename="camel"):
    """ExtenderBindingArgs: the pod to bind and the node chosen."""

    pod_name: str
    pod_namespace: str
    pod_uid: str = msgspec.field(name="podUID")
    node: str = ""


_decode_args = msgspec.json.Decoder(_ExtenderArgs).decode
_decode_node = msgspec.json.Decoder(NodeHead).decode
_decode_binding = msgspec.json.Decoder(BindingArgs).decode
_encode = msgspec.json.Encoder().encode


def parse_args(body: bytes) -> ExtenderArgs:
    """Read ExtenderArgs; raise BadArguments unless it has a pod and nodes (not node names)."""
    try:
        args = _decode_args(body)
    except msgspec.DecodeError as exc:
        raise BadArguments(f"not ExtenderArgs: {exc}") from None
    if not args.pod:
        raise BadArguments("ExtenderArgs without a pod: the body needs \"pod\"")
    metadata = args.pod.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(args.pod.get("spec"), dict):
        raise BadArguments("ExtenderArgs.pod has no metadata or spec object")
    if args.nodes is None:
        if args.nodenames is not None:
            raise BadArguments("ExtenderArgs has nodenames only: configure this extender with "
                               "nodeCacheCapable: false, so the scheduler sends the nodes")
        raise BadArguments("ExtenderArgs without nodes: the body needs \"nodes\": {\"items\": "
                           "[...]}")
    raw = args.nodes.items or []
    try:
        heads = [_decode_node(item) for item in raw]
    except msgspec.DecodeError as exc:
        raise BadArguments(f"ExtenderArgs.nodes.items: {exc}") from None
    for index, head in enumerate(heads):
        if not head.metadata.name:
            raise BadArguments(f"ExtenderArgs.nodes.items[{index}] has no metadata.name")
    return ExtenderArgs(args.pod, heads, raw)


def parse_binding(body: bytes) -> BindingArgs:
    """Read ExtenderBindingArgs; raise BadArguments naming a missing or wrong field."""
    try:
        args = _decode_binding(body)
    except msgspec.DecodeError as exc:
        raise BadArguments(f"not ExtenderBindingArgs: {exc}") from None
    for field, value in (("podName", args.pod_name), ("podNamespace", args.pod_namespace),
                         ("podUID", args.pod_uid), ("node", args.node)):
        if not value:
            raise BadArguments(f"ExtenderBindingArgs.{field} is empty")
    return args


def filter_result(kept: list[msgspec.Raw], failed: dict[str, str],
                  unresolvable: dict[str, str], error: str = "") -> bytes:
    """ExtenderFilterResult: the nodes kept (as they came), and why each other one failed."""
    result: dict[str, Any] = {"nodes": {"items": kept}}
    if failed:
        result["failedNodes"] = failed
    if unresolvable:
        result["failedAndUnresolvableNodes"] = unresolvable
    if error:
        result["error"] = error
    return _encode(result)


def priority_list(scores: list[tuple[str, int]]) -> bytes:
    """HostPriorityList: one ``{"host", "score"}`` per node."""
    return _encode([{"host": host, "score": score} for host, score in scores])


def binding_result(error: str = "") -> bytes:
    """ExtenderBindingResult: empty on success, else the error the pod's events show."""
    return _encode({"error": error} if error else {})
