"""Which GPUs one container gets: those its pod was bound with, checked against this node.

Pure: the pod, the node's GPU ledger and the GPUs present in; the container's GPU UUIDs out,
or a :class:`Refusal` whose message names the pod, the GPU and what is missing. The ledger
(on the Node, written only by vcuda's scheduler extender) is the trusted record; the pod's
``vcuda.io/assigned-gpus`` must agree with it.

A pod's shared containers all get its shared GPU; one with shares of several GPUs (``"gpus": N``
in its ``vcuda.io/limits`` entry) gets the first N of the pod's shared GPUs. Its whole GPUs
are dealt out in the order of its containers: each app container takes the next ones; init
containers run before them, one at a time, and take from the first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from runtime_hook.contract import (
    ASSIGNMENT_ANNOTATION,
    CORES_PER_GPU,
    LIMITS_ANNOTATION,
    SHARED_RESOURCE,
    WHOLE_RESOURCE,
    ContractError,
    entry_gpus,
    entry_limits,
    limits_table,
)
from runtime_hook.hook_errors import NodeError
from runtime_hook.placement import Entry, PlacementError, decode_assignment

_PLACE_AGAIN = "delete the pod so that vcuda's scheduler places it again"


class Refusal(NodeError, RuntimeError):
    """The container cannot be given its GPUs; the message says whose, which and why."""


def container_gpus(pod: Mapping[str, Any], ledger: Mapping[str, Entry], node: str,
                   container: str, resource: str, present: Collection[str],
                   core_keys: Collection[str]) -> tuple[str, ...]:
    """The GPU UUIDs ``container`` of ``pod`` gets for ``resource``.

    Args:
        pod: the Pod as JSON.
        ledger: the node's GPU ledger, by pod uid.
        node: this node's name, for messages.
        container: the container's name.
        resource: :data:`SHARED_RESOURCE` or :data:`WHOLE_RESOURCE`.
        present: the UUIDs of the GPUs this node has now.
        core_keys: the ``<domain>/vcuda-core`` resource names.
    """
    metadata = pod.get("metadata") or {}
    who = f"pod {metadata.get('namespace')}/{metadata.get('name')}"
    entry = ledger.get(metadata.get("uid", ""))
    written = (metadata.get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
    if entry is None:
        if written is None:
            raise Refusal(f"{who} has no GPU assignment: vcuda's scheduler did not place it; "
                          "give it schedulerName vcuda-scheduler (the webhook's "
                          "scheduler_name), or run kube-scheduler with vcuda's extender")
        raise Refusal(f"{who}'s GPU assignment is not in node {node}'s GPU ledger; "
                      f"{_PLACE_AGAIN}")
    assignment = entry.assignment
    try:
        agrees = written is not None and decode_assignment(written) == assignment
    except PlacementError:
        agrees = False
    if not agrees:
        raise Refusal(f"{who}'s {ASSIGNMENT_ANNOTATION} ({written}) disagrees with node {node}'s "
                      f"GPU ledger ({assignment.to_json()}); {_PLACE_AGAIN}")
    if resource == SHARED_RESOURCE:
        if not assignment.shared:
            raise Refusal(f"{who} was bound without a shared GPU, yet container {container} "
                          f"asks for {SHARED_RESOURCE}; {_PLACE_AGAIN}")
        gpus = _shared_share(pod, assignment.shared_gpus(), container, who)
    elif resource == WHOLE_RESOURCE:
        gpus = _whole_share(pod, assignment.whole, container, core_keys, who)
    else:
        raise Refusal(f"vcuda's device plugin does not serve {resource}")
    missing = [uuid for uuid in gpus if uuid not in present]
    if missing:
        raise Refusal(f"GPU {missing[0]}, given to {who} at bind, is not on node {node} now "
                      f"(it has {', '.join(sorted(present)) or 'no GPU'}); {_PLACE_AGAIN}")
    return gpus


def _shared_share(pod: Mapping[str, Any], shared: tuple[str, ...], container: str,
                  who: str) -> tuple[str, ...]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(LIMITS_ANNOTATION, "{}")
    try:
        table = limits_table(raw)
        count = entry_gpus(table, container) if entry_limits(table, container) else 1
    except ContractError as exc:
        raise Refusal(f"{who}: {exc}") from None
    if count > len(shared):
        raise Refusal(f"{who}: container {container} asks for shares of {count} GPUs, and the "
                      f"pod was bound with {len(shared)} shared GPU(s); {_PLACE_AGAIN}")
    return shared[:count]


def _whole_share(pod: Mapping[str, Any], whole: tuple[str, ...], container: str,
                 core_keys: Collection[str], who: str) -> tuple[str, ...]:
    spec = pod.get("spec") or {}
    offset = 0
    for list_name in ("containers", "initContainers"):
        for item in spec.get(list_name) or ():
            count = _whole_count(item, core_keys)
            if item.get("name") == container:
                start = offset if list_name == "containers" else 0
                if count == 0 or start + count > len(whole):
                    raise Refusal(f"{who}: container {container} asks for {count} whole "
                                  f"GPU(s), and the pod was bound with {len(whole)} for all of "
                                  f"its containers; {_PLACE_AGAIN}")
                return whole[start:start + count]
            if list_name == "containers":
                offset += count
    raise Refusal(f"{who} has no container {container}")


def _whole_count(container: Mapping[str, Any], core_keys: Collection[str]) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    try:
        direct = int(str(limits.get(WHOLE_RESOURCE, 0)))
        cores = max((int(str(limits[key])) for key in core_keys if key in limits), default=0)
    except ValueError:
        return 0
    return direct or (cores // CORES_PER_GPU if cores % CORES_PER_GPU == 0 else 0)
