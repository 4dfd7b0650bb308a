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
  as a ``PartialObjectMetadataList`` of the nodes' metadata alone.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonpatch
import jsonpointer

from tests.fake_kube_api import ApiError, FakeKubeApi, conflict, json_body

NODE_AGENT = "system:serviceaccount:vcuda-system:vcuda-node"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
_NODE = re.compile(r"/api/v1/nodes/([^/]+)(/status)?")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge member by member, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeNodesApi(FakeKubeApi):
    """The fake API server serving nodes and their status."""

    def __init__(self, keep_alive: bool = False, subject: str = NODE_AGENT) -> None:
        super().__init__(subject, keep_alive=keep_alive)

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
              body: bytes) -> tuple[int, dict[str, Any]]:
        if path == "/api/v1/nodes" and method == "GET":
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
            self.objects[path] = self.stamp(result)
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
            self.objects[path] = self.stamp(result)
            return copy.deepcopy(result)

    def _list_nodes(self) -> dict[str, Any]:
        selector = (self.local.query.get("labelSelector") or [""])[0]
        terms = [term.partition("=") for term in selector.split(",") if term]
        with self.lock:
            version = str(self._revision)
            nodes = [copy.deepcopy(o) for p, o in self.objects.items()
                     if p.startswith("/api/v1/nodes/")]
        chosen = [n for n in nodes if all(
            key in (labels := n["metadata"].get("labels") or {})
            and (not equals or labels[key] == value) for key, equals, value in terms)]
        if "as=PartialObjectMetadataList" in self.local.accept:
            return {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": version},
                    "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                               "metadata": n["metadata"]} for n in chosen]}
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": version},
                "items": chosen}


def _check_quantity(node: str, field: str, key: str, value: Any) -> None:
    extended = "/" in key and not key.startswith("kubernetes.io/")
    whole = isinstance(value, str) and value.isdigit()
    if extended and not whole:
        raise ApiError(422, "Invalid", f'Node "{node}" is invalid: status.{field}[{key}]: '
                                       f'Invalid value: "{value}": must be an integer')
