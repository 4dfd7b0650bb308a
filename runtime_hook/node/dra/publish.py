"""Keeping this node's ResourceSlice equal to its GPUs: created once, replaced when they change."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runtime_hook.contract import Sharing
from runtime_hook.node.dra.kube import DraApi
from runtime_hook.node.dra.slices import GpuModel, resource_slice, slice_name


def publish(api: DraApi, node: str, gpus: Iterable[GpuModel], sharing: Sharing,
            node_uid: str | None = None) -> str | None:
    """Make ``node``'s slice offer ``gpus``; return what was done ("created", "updated") or None.

    The pool's generation goes up by one with every change, as the scheduler requires; with
    ``node_uid`` the Node owns the slice.
    """
    gpus = list(gpus)
    current = api.slice(slice_name(node))
    if current is None:
        api.create_slice(resource_slice(node, gpus, sharing, 1, node_uid))
        return "created"
    generation = int(current["spec"]["pool"].get("generation", 0))
    wanted = resource_slice(node, gpus, sharing, generation, node_uid)
    if _same(current, wanted):
        return None
    wanted = resource_slice(node, gpus, sharing, generation + 1, node_uid)
    wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    api.replace_slice(wanted)
    return "updated"


def _same(current: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether ``current`` holds all of ``wanted``'s labels, owner and spec; fields the API
    server added (defaults) do not count as a change."""
    metadata = {k: v for k, v in wanted["metadata"].items() if k != "name"}
    return _holds(current["metadata"], metadata) and _holds(current["spec"], wanted["spec"])


def _holds(current: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        return isinstance(current, dict) and all(
            key in current and _holds(current[key], value) for key, value in wanted.items())
    if isinstance(wanted, list):
        return isinstance(current, list) and len(current) == len(wanted) and all(
            _holds(c, w) for c, w in zip(current, wanted))
    return bool(current == wanted)
