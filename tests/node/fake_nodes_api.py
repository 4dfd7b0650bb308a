"""The node endpoints of the Kubernetes API that vcuda uses, on the common fake API server.

- ``GET /api/v1/nodes/<name>``;
- ``PATCH /api/v1/nodes/<name>/status`` with a JSON Patch
  (``application/json-patch+json``), applied with RFC 6902 semantics as the API
  does for the status subresource: only the status changes, a patch that
  cannot be applied is 422, and an extended resource's quantity must be a
  whole number;
- ``PATCH /api/v1/nodes/<name>`` with a JSON merge patch (RFC 7386); a
  ``metadata.resourceVersion`` in the patch makes it conditional (409 when the
  node has moved on), and the status is left alone, as the API server does;
- ``GET /api/v1/nodes``, with a ``labelSelector`` of ``key=value`` and ``key``
  terms, as a ``NodeList``, or, asked for with
  ``Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1``,
  as a ``PartialObjectMetadataList`` of the nodes' metadata alone;
- the same with ``watch=true``: a watch, as kube-apiserver serves it. Its events
  (``{"type": "ADDED" | "MODIFIED" | "DELETED" | "ERROR", "object": ...}``, one
  JSON object a line, in chunks as they happen) follow ``resourceVersion``: none
  or ``0`` starts with an ADDED of each selected node, ``N`` sends what was
  written after revision N, and N older than the last ``watch_window`` node
  writes gets an ERROR event carrying a 410 Expired Status ("too old resource
  version"), as the API server's watch cache answers. A node that stops
  matching the selector is DELETED from the watch, one that starts is ADDED;
  ``timeoutSeconds`` ends the watch, and ``Accept: ...;as=PartialObjectMetadata;
  ...`` sends the nodes' metadata alone.

Events, which the node agent writes about its Node: tests/fake_events.py.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

import jsonpatch
import jsonpointer

from tests.fake_events import ServesEvents
from tests.fake_kube_api import (
    MERGE_PATCH,
    ApiError,
    Streamed,
    conflict,
    json_body,
    merge_patch,
)

NODE_AGENT = "system:serviceaccount:vcuda-system:vcuda-node"
JSON_PATCH = "application/json-patch+json"
_NODE = re.compile(r"/api/v1/nodes/([^/]+)(/status)?")
_NODES = "/api/v1/nodes/"
_METADATA_ONLY = re.compile(r"as=PartialObjectMetadata(;|,|$)")
WATCH_WINDOW = 1000  # node writes a watch can start after (the API server's watch cache)


class _Write(NamedTuple):
    """A node write, as watches replay it."""

    revision: int
    existed: bool  # the node was there before
    labels_before: dict[str, str]
    before: dict[str, Any] | None  # kept where the write may make it leave a selection
    after: dict[str, Any] | None  # None: deleted


class FakeNodesApi(ServesEvents):
    """The fake API server serving nodes and their status."""

    def __init__(self, keep_alive: bool = False, subject: str = NODE_AGENT) -> None:
        super().__init__(subject, keep_alive=keep_alive)
        self.node_events: deque[_Write] = deque(maxlen=WATCH_WINDOW)
        self._compacted = 0  # the revision of the newest node write no longer kept
        self._written = threading.Condition(self.lock)

    def changed(self, path: str, before: dict[str, Any] | None,
                after: dict[str, Any] | None) -> None:
        if not path.startswith(_NODES):
            return
        if len(self.node_events) == self.node_events.maxlen:
            self._compacted = self.node_events[0].revision
        labels_before = dict((before or {}).get("metadata", {}).get("labels") or {})
        labels_after = (after or {}).get("metadata", {}).get("labels") or {}
        kept_before = copy.deepcopy(before) if before is not None and (
            after is None or labels_before != labels_after) else None
        self.node_events.append(_Write(self._revision, before is not None, labels_before,
                                       kept_before, copy.deepcopy(after)))
        self._written.notify_all()

    def forget_node_events(self) -> None:
        """Compact: drop the node writes kept for watches; a watch from a revision before now,
        and one in progress that has not reached it, gets 410."""
        with self.lock:
            self._compacted = self._revision
            self.node_events.clear()

    def add_node(self, name: str, capacity: dict[str, str],
                 labels: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None) -> str:
        """Register a node with ``capacity`` (and the same allocatable); return its path."""
        path = f"/api/v1/nodes/{name}"
        metadata: dict[str, Any] = {"name": name}
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
        self.put(path, {"apiVersion": "v1", "kind": "Node", "metadata": metadata,
                        "spec": {}, "status": {"capacity": dict(capacity),
                                               "allocatable": dict(capacity)}})
        return path

    def route(self, method: str, path: str, content_type: str,
              body: bytes) -> tuple[int, dict[str, Any] | Streamed]:
        if path == "/api/v1/nodes" and method == "GET":
            if (self.local.query.get("watch") or [""])[0] in ("true", "1"):
                self.authorize("watch", "", "nodes", None, None)
                return 200, self._watch_nodes()
            self.authorize("list", "", "nodes", None, None)
            return 200, self._list_nodes()
        match = _NODE.fullmatch(path)
        if match is None:
            return super().route(method, path, content_type, body)
        name, status = match.groups()
        item = f"/api/v1/nodes/{name}"
        if method == "GET" and not status:
            self.authorize("get", "", "nodes", None, name)
            return 200, self.read(item, "nodes", name)
        if method == "PATCH" and status:
            self.authorize("patch", "", "nodes/status", None, name)
            return 200, self._patch_status(item, name, content_type, body)
        if method == "PATCH":
            self.authorize("patch", "", "nodes", None, name)
            return 200, self._merge_node(item, name, content_type, body)
        raise ApiError(405, "MethodNotAllowed", "not implemented by this test server")

    def _patch_status(self, path: str, name: str, content_type: str,
                      body: bytes) -> dict[str, Any]:
        if content_type.split(";")[0].strip() != JSON_PATCH:
            raise ApiError(415, "UnsupportedMediaType",
                           f"this test server implements only {JSON_PATCH} (got {content_type})")
        operations = json_body(body, list)
        with self.lock:
            current = self.read(path, "nodes", name)
            self.about_to_write(path)
            try:
                patched = jsonpatch.apply_patch(current, operations)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an "
                                               f"error in our request: {exc}") from None
            result = copy.deepcopy(current)
            result["status"] = patched.get("status") or {}  # the status subresource
            for field in ("capacity", "allocatable"):
                for key, value in (result["status"].get(field) or {}).items():
                    _check_quantity(name, field, key, value)
            self.store(path, result)
            return copy.deepcopy(result)

    def _merge_node(self, path: str, name: str, content_type: str,
                    body: bytes) -> dict[str, Any]:
        if content_type.split(";")[0].strip() != MERGE_PATCH:
            raise ApiError(415, "UnsupportedMediaType",
                           f"this test server implements {MERGE_PATCH} here (got {content_type})")
        patch = json_body(body)
        with self.lock:
            self.about_to_write(path)  # a concurrent writer lands first, as it may in etcd
            node = self.read(path, "nodes", name)
            version = (patch.get("metadata") or {}).get("resourceVersion")
            if version is not None and version != node["metadata"]["resourceVersion"]:
                raise conflict("nodes", name)
            result = merge_patch(node, patch)
            result["status"] = node.get("status")  # the status subresource is apart
            self.store(path, result)
            return copy.deepcopy(result)

    def _list_nodes(self) -> dict[str, Any]:
        terms = self._selector()
        with self.lock:
            version = str(self._revision)
            nodes = [copy.deepcopy(o) for p, o in self.objects.items() if p.startswith(_NODES)]
        chosen = [n for n in nodes if _selected(n["metadata"].get("labels"), terms)]
        if "as=PartialObjectMetadataList" in self.local.accept:
            return {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": version},
                    "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                               "metadata": n["metadata"]} for n in chosen]}
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": version},
                "items": chosen}

    def _selector(self) -> list[tuple[str, str, str]]:
        selector = (self.local.query.get("labelSelector") or [""])[0]
        return [term.partition("=") for term in selector.split(",") if term]

    def _watch_nodes(self) -> Streamed:
        query = self.local.query
        terms = self._selector()
        since = (query.get("resourceVersion") or [""])[0]
        timeout = float((query.get("timeoutSeconds") or ["1800"])[0])
        metadata_only = bool(_METADATA_ONLY.search(self.local.accept))

        def shown(node: dict[str, Any]) -> dict[str, Any]:
            if not metadata_only:
                return node
            return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": node["metadata"]}

        def line(kind: str, obj: dict[str, Any]) -> bytes:
            return json.dumps({"type": kind, "object": obj}).encode() + b"\n"

        def events() -> Iterator[bytes]:
            deadline = time.monotonic() + timeout
            with self.lock:
                if since in ("", "0"):  # the state now, then what follows
                    last = self._revision
                    ready = [line("ADDED", shown(copy.deepcopy(o)))
                             for p, o in self.objects.items()
                             if p.startswith(_NODES) and _selected(o["metadata"].get("labels"),
                                                                   terms)]
                else:
                    last, ready = int(since), []
            yield b"".join(ready)
            while not self.stopping.is_set() and time.monotonic() < deadline:
                with self.lock:
                    if last < self._compacted:
                        yield line("ERROR", _expired(last, self._compacted))
                        return
                    new = [event for event in self.node_events if event.revision > last]
                    if not new:
                        self._written.wait(min(0.1, max(deadline - time.monotonic(), 0)))
                        continue
                    lines = [line(kind, shown(obj)) for kind, obj in
                             (_event(event, terms) for event in new) if kind]
                    last = new[-1].revision
                if lines:
                    yield b"".join(lines)

        return Streamed(events())


def _selected(labels: dict[str, str] | None, terms: list[tuple[str, str, str]]) -> bool:
    labels = labels or {}
    return all(key in labels and (not equals or labels[key] == value)
               for key, equals, value in terms)


def _event(write: _Write, terms: list[tuple[str, str, str]]) -> tuple[str, dict[str, Any]]:
    """The watch event a node write makes for a selector: ("", {}) for none. A node leaving the
    selection is sent as it was, with the revision of the write that made it leave."""
    was = write.existed and _selected(write.labels_before, terms)
    after = write.after
    if after is not None and _selected(after["metadata"].get("labels"), terms):
        return ("MODIFIED" if was else "ADDED"), copy.deepcopy(after)
    if was and write.before is not None:
        gone = copy.deepcopy(write.before)
        gone["metadata"]["resourceVersion"] = str(write.revision)
        return "DELETED", gone
    return "", {}


def _expired(since: int, oldest: int) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f"too old resource version: {since} ({oldest + 1})", "reason": "Expired",
            "code": 410}


def _check_quantity(node: str, field: str, key: str, value: Any) -> None:
    extended = "/" in key and not key.startswith("kubernetes.io/")
    whole = isinstance(value, str) and value.isdigit()
    if extended and not whole:
        raise ApiError(422, "Invalid", f'Node "{node}" is invalid: status.{field}[{key}]: '
                                       f'Invalid value: "{value}": must be an integer')
