"""Pods, bindings and nodes' metadata on the common fake API server, for per-GPU placement.

Adds to :class:`~tests.node.fake_nodes_api.FakeNodesApi`:

- ``PATCH /api/v1/nodes/<name>`` with a JSON merge patch (RFC 7386); a
  ``metadata.resourceVersion`` in the patch makes it conditional (409 when the
  node has moved on), as the API server does;
- ``GET``/``DELETE /api/v1/namespaces/<ns>/pods/<name>`` and ``GET /api/v1/pods``
  with ``fieldSelector=spec.nodeName=<node>``;
- ``POST .../pods/<name>/binding``: the Binding's ``metadata.uid`` and
  ``resourceVersion`` are preconditions (409), a pod bound already is 409, and
  the Binding's annotations are copied onto the pod with ``spec.nodeName``,
  as the API server's binding storage does.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.fake_kube_api import ApiError, conflict, json_body
from tests.node.fake_nodes_api import FakeNodesApi

MERGE_PATCH = "application/merge-patch+json"
_POD = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)(/binding)?")
_NODE = re.compile(r"/api/v1/nodes/([^/]+)")


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


class FakeClusterApi(FakeNodesApi):
    """Nodes, pods and bindings."""

    def __init__(self, keep_alive: bool = True) -> None:
        super().__init__(keep_alive=keep_alive)

    def add_pod(self, pod: dict[str, Any]) -> str:
        """Store ``pod`` (which names its namespace); return its path."""
        metadata = pod["metadata"]
        path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}"
        self.put(path, pod)
        return path

    def remove(self, path: str) -> None:
        """Delete the object at ``path``, as if another client did."""
        with self.lock:
            self.objects.pop(path, None)

    def pods(self) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for p, o in self.objects.items() if "/pods/" in p]

    def route(self, method: str, path: str, content_type: str,
              body: bytes) -> tuple[int, dict[str, Any]]:
        pod = _POD.fullmatch(path)
        if pod is not None:
            namespace, name, binding = pod.groups()
            return self._pod(method, path.removesuffix("/binding"), namespace, name,
                             bool(binding), body)
        if path == "/api/v1/pods" and method == "GET":
            self.authorize("list", "", "pods", None, None)
            return 200, self._list_pods()
        node = _NODE.fullmatch(path)
        if node is not None and method == "PATCH":
            self.authorize("patch", "", "nodes", None, node.group(1))
            return 200, self._merge_node(path, node.group(1), content_type, body)
        return super().route(method, path, content_type, body)

    def _pod(self, method: str, path: str, namespace: str, name: str, binding: bool,
             body: bytes) -> tuple[int, dict[str, Any]]:
        if binding and method == "POST":
            self.authorize("create", "", "pods/binding", namespace, name)
            return 201, self._bind(path, name, json_body(body))
        if method == "GET" and not binding:
            self.authorize("get", "", "pods", namespace, name)
            return 200, self.read(path, "pods", name)
        if method == "DELETE" and not binding:
            self.authorize("delete", "", "pods", namespace, name)
            with self.lock:
                gone = self.read(path, "pods", name)
                del self.objects[path]
                self._revision += 1
            return 200, gone
        raise ApiError(405, "MethodNotAllowed", "not implemented by this test server")

    def _bind(self, path: str, name: str, binding: dict[str, Any]) -> dict[str, Any]:
        metadata = binding.get("metadata") or {}
        target = (binding.get("target") or {}).get("name")
        if not target:
            raise ApiError(422, "Invalid", "Binding.target.name: Required value")
        with self.lock:
            self.about_to_write(path)
            pod = self.read(path, "pods", name)
            uid = metadata.get("uid")
            if uid and uid != pod["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f"Precondition failed: UID in precondition: "
                                                f"{uid}, UID in object meta: "
                                                f"{pod['metadata']['uid']}")
            version = metadata.get("resourceVersion")
            if version and version != pod["metadata"]["resourceVersion"]:
                raise conflict("pods", name)
            if (pod.get("spec") or {}).get("nodeName"):
                raise ApiError(409, "Conflict", f"pod {name} is already assigned to node "
                                                f"\"{pod['spec']['nodeName']}\"")
            pod["spec"]["nodeName"] = target
            if metadata.get("annotations"):
                pod["metadata"].setdefault("annotations", {}).update(metadata["annotations"])
            self.objects[path] = self.stamp(pod)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

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

    def _list_pods(self) -> dict[str, Any]:
        selector = (self.local.query.get("fieldSelector") or [""])[0]
        node = selector.removeprefix("spec.nodeName=") if selector else None
        with self.lock:  # select, then copy only what is answered
            items = [copy.deepcopy(o) for p, o in self.objects.items() if "/pods/" in p
                     and (node is None or (o.get("spec") or {}).get("nodeName") == node)]
            version = str(self._revision)
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": version},
                "items": items}


@contextmanager
def running(cert_dir: Path) -> Iterator[FakeClusterApi]:
    """A started FakeClusterApi (its TLS files in ``cert_dir``), stopped afterwards."""
    server = FakeClusterApi()
    server.start(cert_dir)
    try:
        yield server
    finally:
        server.stop()
