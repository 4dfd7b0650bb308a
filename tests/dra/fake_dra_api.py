"""The ``resource.k8s.io/v1`` endpoints the DRA driver uses, on the common fake API server.

``GET`` of nodes and of namespaced ResourceClaims; ``GET``, ``POST`` and ``PUT`` of
ResourceSlices, as the API does them: a create of an existing name is 409
AlreadyExists, an update with a stale ``resourceVersion`` is 409 Conflict,
every written slice must validate strictly against the Kubernetes schema
(422 otherwise), and the ValidatingAdmissionPolicy of
``manifests/dra/slice-policy.yaml`` is evaluated (with a CEL interpreter) on
each write, with the node name that a pod-bound token carries in the user's
``extra``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import celpy
import kubernetes_validate

from tests.deploy.manifests import ROOT, documents
from tests.fake_events import ServesEvents
from tests.fake_kube_api import ApiError, json_body

NODE_AGENT = "system:serviceaccount:vcuda-system:vcuda-node"
GROUP = "resource.k8s.io"
PREFIX = f"/apis/{GROUP}/v1"
SCHEMA_VERSION = "1.34"
_NODE = re.compile(r"/api/v1/nodes/([^/]+)")
_CLAIM = re.compile(rf"{PREFIX}/namespaces/([^/]+)/resourceclaims/([^/]+)")
_SLICES = re.compile(rf"{PREFIX}/resourceslices(?:/([^/]+))?")


def claim_path(namespace: str, name: str) -> str:
    return f"{PREFIX}/namespaces/{namespace}/resourceclaims/{name}"


def slice_path(name: str) -> str:
    return f"{PREFIX}/resourceslices/{name}"


class FakeDraApi(ServesEvents):
    """The fake API server serving claims and slices; ``node_name`` is in the token's extra."""

    def __init__(self, node_name: str | None) -> None:
        super().__init__(NODE_AGENT)
        self.node_name = node_name
        [self._policy] = [d for d in documents(ROOT / "dra" / "slice-policy.yaml")
                          if d["kind"] == "ValidatingAdmissionPolicy"]
        self._cel = celpy.Environment()

    def add_claim(self, claim: dict[str, Any]) -> None:
        """Store ``claim`` (with its status) as the scheduler left it."""
        metadata = claim["metadata"]
        self.put(claim_path(metadata["namespace"], metadata["name"]), claim)

    def add_node(self, name: str) -> str:
        """Register the Node ``name``; return its UID."""
        path = f"/api/v1/nodes/{name}"
        self.put(path, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        return str(self.objects[path]["metadata"]["uid"])

    def route(self, method: str, path: str, content_type: str,
              body: bytes) -> tuple[int, dict[str, Any]]:
        node = _NODE.fullmatch(path)
        if node and method == "GET":
            self.authorize("get", "", "nodes", None, node.group(1))
            return 200, self.read(path, "nodes", node.group(1))
        claim = _CLAIM.fullmatch(path)
        if claim and method == "GET":
            namespace, name = claim.groups()
            self.authorize("get", GROUP, "resourceclaims", namespace, name)
            return 200, self.read(path, "resourceclaims.resource.k8s.io", name)
        slices = _SLICES.fullmatch(path)
        if slices is None:
            return super().route(method, path, content_type, body)
        name = slices.group(1)
        if method == "GET" and name:
            self.authorize("get", GROUP, "resourceslices", None, name)
            return 200, self.read(path, "resourceslices.resource.k8s.io", name)
        if method == "POST" and not name:
            return 201, self._write("create", json_body(body))
        if method == "PUT" and name:
            return 200, self._write("update", json_body(body), name)
        raise ApiError(405, "MethodNotAllowed", "not implemented by this test server")

    def _write(self, verb: str, obj: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        name = name or obj.get("metadata", {}).get("name", "")
        self.authorize(verb, GROUP, "resourceslices", None, name)
        path = slice_path(name)
        try:
            kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise ApiError(422, "Invalid", f'ResourceSlice "{name}" is invalid: {exc.message}') \
                from None
        with self.lock:
            old = self.objects.get(path)
            if verb == "create" and old is not None:
                raise ApiError(409, "AlreadyExists",
                               f'resourceslices.resource.k8s.io "{name}" already exists')
            if verb == "update":
                if old is None:
                    raise ApiError(404, "NotFound",
                                   f'resourceslices.resource.k8s.io "{name}" not found')
                sent = obj.get("metadata", {}).get("resourceVersion")
                if sent != old["metadata"]["resourceVersion"]:
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on '
                                   f'resourceslices.resource.k8s.io "{name}": the object has been '
                                   "modified; please apply your changes to the latest version "
                                   "and try again")
            self._admit(verb.upper(), obj, old)
            self.about_to_write(path)
            stored = copy.deepcopy(obj)
            if old is not None:
                stored["metadata"]["uid"] = old["metadata"]["uid"]
            self.objects[path] = self.stamp(stored)
            return copy.deepcopy(stored)

    def _admit(self, operation: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Evaluate the policy as the API server's admission does; 422 with its message."""
        extra = {"authentication.kubernetes.io/node-name": [self.node_name]} \
            if self.node_name else {}
        request = {"operation": operation,
                   "userInfo": {"username": self.subject, "extra": extra}}
        activation: dict[str, Any] = {"request": celpy.json_to_cel(request),
                                      "object": celpy.json_to_cel(obj),
                                      "oldObject": celpy.json_to_cel(old)}
        spec = self._policy["spec"]
        if not all(self._eval(c["expression"], activation) for c in spec["matchConditions"]):
            return
        variables: dict[Any, Any] = {}
        for variable in spec["variables"]:
            activation["variables"] = celpy.celtypes.MapType(variables)
            value = self._eval(variable["expression"], activation)
            variables[celpy.celtypes.StringType(variable["name"])] = value
        activation["variables"] = celpy.celtypes.MapType(variables)
        for rule in spec["validations"]:
            if not self._eval(rule["expression"], activation):
                message = (self._eval(rule["messageExpression"], activation)
                           if "messageExpression" in rule else rule["message"])
                name = obj["metadata"]["name"]
                policy = self._policy["metadata"]["name"]
                raise ApiError(422, "Invalid",
                               f'resourceslices.resource.k8s.io "{name}" is forbidden: '
                               f"ValidatingAdmissionPolicy '{policy}' denied request: {message}")

    def _eval(self, expression: str, activation: dict[str, Any]) -> Any:
        return self._cel.program(self._cel.compile(expression)).evaluate(activation)
