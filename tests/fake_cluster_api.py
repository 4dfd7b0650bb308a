"""Pods, bindings and nodes' metadata on the common fake API server, for per-GPU placement.

Adds to :class:`~tests.node.fake_nodes_api.FakeNodesApi`:

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

from tests.fake_kube_api import ApiError, Streamed, conflict, json_body
from tests.node.fake_nodes_api import FakeNodesApi

_POD = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)(/binding)?")


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
            if path in self.objects:
                self.store(path, None)

    def pods(self) -> list[dict[str, Any]]:
        with self.lock:
            return [copy.deepcopy(o) for p, o in self.objects.items() if "/pods/" in p]

    def route(self, method: str, path: str, content_type: str,
              body: bytes) -> tuple[int, dict[str, Any] | Streamed]:
        pod = _POD.fullmatch(path)
        if pod is not None:
            namespace, name, binding = pod.groups()
            return self._pod(method, path.removesuffix("/binding"), namespace, name,
                             bool(binding), body)
        if path == "/api/v1/pods" and method == "GET":
            self.authorize("list", "", "pods", None, None)
            return 200, self._list_pods()
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
                self.store(path, None)
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
            self.store(path, pod)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

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
