"""The node endpoints of the Kubernetes API that the node agent uses, on the common fake API server.

``GET /api/v1/nodes/<name>`` and ``PATCH /api/v1/nodes/<name>/status`` with
a JSON Patch (``application/json-patch+json``), applied with RFC 6902
semantics as the API does for the status subresource: only the status
changes, a patch that cannot be applied is 422, and an extended resource's
quantity must be a whole number.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonpatch
import jsonpointer

from tests.fake_kube_api import ApiError, FakeKubeApi, json_body

NODE_AGENT = "system:serviceaccount:vcuda-system:vcuda-node"
JSON_PATCH = "application/json-patch+json"
_NODE = re.compile(r"/api/v1/nodes/([^/]+)(/status)?")


class FakeNodesApi(FakeKubeApi):
    """The fake API server serving nodes and their status."""

    def __init__(self, keep_alive: bool = False) -> None:
        super().__init__(NODE_AGENT, keep_alive=keep_alive)

    def add_node(self, name: str, capacity: dict[str, str]) -> str:
        """Register a node with ``capacity`` (and the same allocatable); return its path."""
        path = f"/api/v1/nodes/{name}"
        self.put(path, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                        "spec": {}, "status": {"capacity": dict(capacity),
                                               "allocatable": dict(capacity)}})
        return path

    def route(self, method: str, path: str, content_type: str,
              body: bytes) -> tuple[int, dict[str, Any]]:
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


def _check_quantity(node: str, field: str, key: str, value: Any) -> None:
    extended = "/" in key and not key.startswith("kubernetes.io/")
    whole = isinstance(value, str) and value.isdigit()
    if extended and not whole:
        raise ApiError(422, "Invalid", f'Node "{node}" is invalid: status.{field}[{key}]: '
                                       f'Invalid value: "{value}": must be an integer')
