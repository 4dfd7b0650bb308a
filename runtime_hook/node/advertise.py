"""Advertising the node's GPUs: the inventory file the hook reads, and extended resources in the
node's status that the scheduler fits pods against.

``<domain>/vcuda-core`` is 100 per GPU; ``<domain>/vcuda-memory`` is each
GPU's memory times the memory scaling in 256 MiB units, rounded down per GPU (a
container's memory must fit on one GPU), summed. Each domain gets the full
amount: pods of one cluster should use one domain. Both ``capacity`` and
``allocatable`` are set with a JSON Patch on ``nodes/<name>/status``; the
kubelet leaves extended resources it does not manage alone. The largest share
one GPU gives goes on the Node as an annotation, for the webhook's bound on
``vcuda-memory``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Generator, Iterable
from typing import Any

from runtime_hook.contract import (
    MAX_GPU_MEMORY_ANNOTATION,
    MEMORY_UNIT,
    Gpu,
    InventoryError,
    Sharing,
    is_mig,
    pointer_token,
    read_inventory,
    resource_names,
    write_inventory,
)
from runtime_hook.hook_errors import NodeError
from runtime_hook.kube_credentials import CredentialsError, api_client

Operation = dict[str, Any]  # one JSON Patch operation
_FIELDS = ("capacity", "allocatable")
_FIX_RBAC = ("grant it with manifests/base/node-rbac.yaml (get and patch nodes, patch "
             "nodes/status) and, with --placement, manifests/placement/component/node-rbac.yaml "
             "(get and list pods)")


class AdvertiseError(NodeError, RuntimeError):
    """The node's status cannot be read or written; the message says why and what to do."""


def resources(gpus: Iterable[Gpu], domains: Iterable[str], sharing: Sharing) -> dict[str, str]:
    """The extended resources ``gpus`` give, as the quantities (strings) of a node's status."""
    gpus = list(gpus)
    cores = sharing.cores() * len(gpus)
    memory = sum(sharing.memory(gpu.memory) // MEMORY_UNIT for gpu in gpus)
    found = {}
    for domain in domains:
        core, memory_name = resource_names(domain)
        found[core] = str(cores)
        found[memory_name] = str(memory)
    return found


def status_patch(node: dict[str, Any], wanted: dict[str, str]) -> list[Operation]:
    """JSON Patch operations that make ``node``'s capacity and allocatable hold ``wanted``."""
    status = node.get("status") or {}
    operations: list[Operation] = []
    for field in _FIELDS:
        present = status.get(field)
        if present is None:
            operations.append({"op": "add", "path": f"/status/{field}", "value": dict(wanted)})
            continue
        for name, quantity in sorted(wanted.items()):
            if present.get(name) != quantity:
                path = f"/status/{field}/{pointer_token(name)}"
                operations.append({"op": "add", "path": path, "value": quantity})
    return operations


def largest_share_change(node: dict[str, Any], gpus: Iterable[Gpu],
                         scaling: float) -> dict[str, str | None] | None:
    """The annotations to merge into ``node`` so that it publishes the most memory one share may
    have on its GPUs (None removes it where there are none); None when it already does."""
    largest = max((int(gpu.memory * scaling) for gpu in gpus), default=0)
    wanted = str(largest) if largest >= MEMORY_UNIT else None
    present = ((node.get("metadata") or {}).get("annotations") or {}).get(
        MAX_GPU_MEMORY_ANNOTATION)
    return None if present == wanted else {MAX_GPU_MEMORY_ANNOTATION: wanted}


def update_inventory(path: str, gpus: list[Gpu]) -> bool:
    """Make the inventory file at ``path`` list ``gpus``; return whether it had to change."""
    try:
        current = read_inventory(path)
    except InventoryError:
        current = None  # unusable: rewrite it
    if current is not None and set(current.values()) == set(gpus):
        return False
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_inventory(path, sorted(gpus, key=lambda gpu: (gpu.index, not is_mig(gpu.uuid))))
    return True


class NodeStatus:
    """One node's status through the ``kubernetes`` client."""

    def __init__(self, node: str, kubeconfig: str | None = None) -> None:
        from kubernetes import client

        self.node = node
        try:
            self.client = api_client(kubeconfig)  # shared with the node's Event recorder
        except CredentialsError as exc:
            raise AdvertiseError(str(exc), exc.fix) from None
        self._api = client.CoreV1Api(self.client)

    def read(self) -> dict[str, Any]:
        """The node object, as JSON."""
        answer = self._call(
            "get nodes", lambda: self._api.read_node(self.node, _preload_content=False)
        )
        return json.loads(answer.data)

    def patch(self, operations: list[Operation]) -> None:
        """Apply ``operations`` (JSON Patch) to the node's status."""
        self._call("patch nodes/status", lambda: self._api.patch_node_status(
            self.node, operations, _preload_content=False)).drain_conn()  # frees the connection

    def annotate(self, annotations: dict[str, str | None], version: str | None = None) -> bool:
        """Merge ``annotations`` into the node's (None removes one); with ``version``, only if
        the node is still at that resourceVersion: False when it is not."""
        body: dict[str, Any] = {"metadata": {"annotations": annotations}}
        if version is not None:
            body["metadata"]["resourceVersion"] = version
        answer = self._call("patch nodes", lambda: self._api.patch_node(
            self.node, body, _content_type="application/merge-patch+json",
            _preload_content=False), conflict_ok=version is not None)
        if answer is _CONFLICT:
            return False
        answer.drain_conn()  # unread, the connection never goes back to the pool
        return True

    def pods(self) -> list[dict[str, Any]]:
        """The pods bound to this node, as JSON."""
        answer = self._call("list pods", lambda: self._api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", _preload_content=False))
        return json.loads(answer.data).get("items") or []

    def pods_version(self) -> str:
        """The resourceVersion of a list of the pods bound to this node (one item asked: the
        version is the list's, whatever its length)."""
        answer = self._call("list pods", lambda: self._api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", limit=1, _preload_content=False))
        return str((json.loads(answer.data).get("metadata") or {}).get("resourceVersion") or "")

    def watch_pods(self, version: str,
                   seconds: int) -> tuple[Generator[bytes, None, None], Callable[[], None]]:
        """The lines of a watch of the pods bound to this node from ``version``, ended by the
        API server after ``seconds``, and how to interrupt it from another thread."""
        answer = self._call("watch pods", lambda: self._api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node}", watch=True, resource_version=version,
            allow_watch_bookmarks=True, timeout_seconds=seconds, _preload_content=False,
            _request_timeout=(10, seconds + 60)))
        return _lines(answer), answer.shutdown

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One pod, as JSON; None when it does not exist."""
        answer = self._call("get pods", lambda: self._api.read_namespaced_pod(
            name, namespace, _preload_content=False), missing_ok=True)
        return None if answer is _MISSING else json.loads(answer.data)

    def _call(self, what: str, call: Any, conflict_ok: bool = False,
              missing_ok: bool = False) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call()
        except ApiException as exc:
            reason = _message(exc)
            if exc.status == 409 and conflict_ok:
                return _CONFLICT
            if exc.status == 404 and missing_ok:
                return _MISSING
            if exc.status == 403:
                raise AdvertiseError(f"not allowed to {what} {self.node!r}: {reason}; "
                                     f"{_FIX_RBAC}") from None
            if exc.status == 404:
                raise AdvertiseError(f"node {self.node!r} does not exist: check --node-name "
                                     "(the DaemonSet sets it from spec.nodeName)") from None
            raise AdvertiseError(f"cannot {what} {self.node!r}: HTTP {exc.status}: {reason}") \
                from None
        except HTTPError as exc:
            raise AdvertiseError(f"cannot reach the API server to {what}: {exc}") from None


def _lines(answer: Any) -> Generator[bytes, None, None]:
    """The newline-ended lines of a streamed answer as they arrive; closed, it gives the
    connection back."""
    held = b""
    try:
        for chunk in answer.stream(amt=None, decode_content=True):
            held += chunk
            *lines, held = held.split(b"\n")
            yield from lines
        if held:
            yield held
    finally:
        answer.release_conn()


_CONFLICT, _MISSING = object(), object()  # what _call answers for a 409 or 404 it was told of


def _message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(exc.reason or exc.body or "no message")
