"""Taking vcuda off its Node at uninstall: the extended resources the agent advertised in the
node's status and the annotations vcuda wrote on it.

The kubelet keeps extended resources that it does not manage itself, so a node stays
advertising ``<domain>/vcuda-core`` and ``<domain>/vcuda-memory`` after the agent is gone
unless they are taken out. The resources of vcuda's device plugin (``vcuda.io/shared-gpu``,
``vcuda.io/gpu``) are the kubelet's own: it drops them once the plugin has been gone a while.
"""

from __future__ import annotations

import logging
from typing import Any

from runtime_hook.contract import (
    CORE_RESOURCE,
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    MAX_GPU_MEMORY_ANNOTATION,
    MEMORY_RESOURCE,
    pointer_token,
)
from runtime_hook.node.advertise import NodeStatus, Operation
from runtime_hook.node.logs import event

ANNOTATIONS = (MAX_GPU_MEMORY_ANNOTATION, INVENTORY_ANNOTATION, LEDGER_ANNOTATION)
_FIELDS = ("capacity", "allocatable")


def is_vcuda_resource(name: str) -> bool:
    """Whether ``name`` is one the agent advertises, under any domain it was given."""
    return name.rpartition("/")[2] in (CORE_RESOURCE, MEMORY_RESOURCE) and "/" in name


def vcuda_resources(node: dict[str, Any]) -> list[str]:
    """The vcuda resources in ``node``'s capacity or allocatable."""
    status = node.get("status") or {}
    return sorted({name for field in _FIELDS for name in status.get(field) or {}
                   if is_vcuda_resource(name)})


def status_removal(node: dict[str, Any]) -> list[Operation]:
    """JSON Patch operations that take every vcuda resource out of ``node``'s status; each
    removal is preceded by a test of its value, so that a status changed since it was read
    fails the patch instead of losing a write."""
    status = node.get("status") or {}
    operations: list[Operation] = []
    for field in _FIELDS:
        present = status.get(field) or {}
        for name in vcuda_resources(node):
            if name in present:
                path = f"/status/{field}/{pointer_token(name)}"
                operations += [{"op": "test", "path": path, "value": present[name]},
                               {"op": "remove", "path": path}]
    return operations


def annotation_removal(node: dict[str, Any]) -> dict[str, str | None]:
    """The annotations to merge into ``node`` (each None: removed) that take vcuda's away."""
    present = (node.get("metadata") or {}).get("annotations") or {}
    return {name: None for name in ANNOTATIONS if name in present}


def clean_node(status: NodeStatus, log: logging.Logger) -> None:
    """Remove vcuda's resources and annotations from the node of ``status``; idempotent."""
    node = status.read()
    operations = status_removal(node)
    if operations:
        status.patch(operations)
    annotations = annotation_removal(node)
    if annotations:
        status.annotate(annotations)
    event(log, logging.INFO, "node_cleaned", node=status.node, resources=vcuda_resources(node),
          annotations=sorted(annotations))
