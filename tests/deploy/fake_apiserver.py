"""The endpoints of the Kubernetes API that `vcuda-certs` uses, on the common fake API server.

What the tool calls, with the real API's semantics: get, create and replace
of Secrets; get and strategic-merge patch of MutatingWebhookConfigurations
(404 NotFound, 409 AlreadyExists and Conflict on a stale resourceVersion,
415 for patch types it does not implement, 422 for invalid objects). TLS,
tokens, RBAC and resourceVersions come from ``tests/fake_kube_api.py``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
from collections.abc import Mapping
from typing import Any

from tests.fake_kube_api import (
    ApiError,
    FakeKubeApi,
    Request,
    Rule,
    conflict,
    json_body,
    rules_from_manifests,
)

SERVICE_ACCOUNT = "system:serviceaccount:vcuda-system:vcuda-certs"
_SECRET = re.compile(r"/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?")
_MWC = re.compile(r"/apis/admissionregistration\.k8s\.io/v1/mutatingwebhookconfigurations/([^/]+)")
_SMP = "application/strategic-merge-patch+json"

__all__ = ["ApiError", "FakeApiServer", "Request", "Rule", "rules_from_manifests"]


class FakeApiServer(FakeKubeApi):
    """The fake API server serving Secrets and MutatingWebhookConfigurations."""

    def __init__(self, token: str = "test-token") -> None:
        super().__init__(SERVICE_ACCOUNT, token)

    def route(self, method: str, path: str, content_type: str,
              body: bytes) -> tuple[int, dict[str, Any]]:
        secret, mwc = _SECRET.fullmatch(path), _MWC.fullmatch(path)
        if secret:
            namespace, name = secret.groups()
            verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}[method]
            self.authorize(verb, "", "secrets", namespace, name)
            if method == "POST" and name is None:
                return 201, self._create_secret(namespace, json_body(body))
            if name is None:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            item = f"/api/v1/namespaces/{namespace}/secrets/{name}"
            if method == "GET":
                return 200, self.read(item, "secrets", name)
            if method == "PUT":
                return 200, self._replace_secret(item, name, namespace, json_body(body))
            raise ApiError(405, "MethodNotAllowed", "not implemented by this test server")
        elif mwc:
            name = mwc.group(1)
            verb = {"GET": "get", "PATCH": "patch", "PUT": "update"}[method]
            self.authorize(verb, "admissionregistration.k8s.io",
                            "mutatingwebhookconfigurations", None, name)
            if method == "GET":
                return 200, self.read(path, "mutatingwebhookconfigurations", name)
            if method == "PATCH":
                return 200, self._patch_mwc(path, name, content_type, json_body(body))
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _create_secret(self, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        metadata = obj.get("metadata") or {}
        name = metadata.get("name")
        if not name:
            raise ApiError(422, "Invalid", "Secret is invalid: metadata.name: Required value")
        if metadata.get("resourceVersion"):
            raise ApiError(500, "InternalError",
                           "resourceVersion should not be set on objects to be created")
        if metadata.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match "
                                              "the namespace on the request")
        _validate_secret(obj)
        path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        with self.lock:
            self.about_to_write(path)
            if path in self.objects:
                raise ApiError(409, "AlreadyExists", f'secrets "{name}" already exists')
            obj["metadata"]["namespace"] = namespace
            self.objects[path] = self.stamp(obj)
            return copy.deepcopy(obj)

    def _replace_secret(self, path: str, name: str, namespace: str,
                        obj: dict[str, Any]) -> dict[str, Any]:
        if (obj.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name "
                                              "on the URL")
        _validate_secret(obj)
        with self.lock:
            current = self.objects.get(path)
            if current is None:
                raise ApiError(404, "NotFound", f'secrets "{name}" not found')
            self.about_to_write(path)
            current = self.objects[path]
            wanted = obj["metadata"].get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise conflict("secrets", name)
            if obj.get("type", "Opaque") != current.get("type", "Opaque"):
                raise ApiError(422, "Invalid", "Secret is invalid: type: Invalid value: "
                                               "field is immutable")
            obj["metadata"].update(namespace=namespace, uid=current["metadata"]["uid"])
            self.objects[path] = self.stamp(obj)
            return copy.deepcopy(obj)

    def _patch_mwc(self, path: str, name: str, content_type: str,
                   patch: dict[str, Any]) -> dict[str, Any]:
        if content_type.split(";")[0].strip() != _SMP:
            raise ApiError(415, "UnsupportedMediaType",
                           f"this test server implements only {_SMP} (got {content_type})")
        with self.lock:
            current = self.objects.get(path)
            if current is None:
                raise ApiError(404, "NotFound",
                               f'mutatingwebhookconfigurations.admissionregistration.k8s.io '
                               f'"{name}" not found')
            self.about_to_write(path)
            current = self.objects[path]
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise conflict("mutatingwebhookconfigurations.admissionregistration.k8s.io",
                                name)
            patched = _strategic_merge(current, patch)
            for i, webhook in enumerate(patched.get("webhooks") or []):
                _validate_webhook(i, webhook)
            self.objects[path] = self.stamp(patched)
            return copy.deepcopy(patched)


def _strategic_merge(current: Any, patch: Any) -> Any:
    """Strategic merge as the API applies it to these objects: maps merge key by key,
    a null deletes, and the ``webhooks`` list merges its items by ``name``."""
    if not isinstance(patch, dict) or not isinstance(current, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(current)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif key == "webhooks" and isinstance(value, list):
            by_name = {w["name"]: w for w in merged.get("webhooks") or []}
            for item in value:
                by_name[item["name"]] = _strategic_merge(by_name.get(item["name"], {}), item)
            merged["webhooks"] = list(by_name.values())
        else:
            merged[key] = _strategic_merge(merged.get(key), value)
    return merged


def _validate_secret(obj: Mapping[str, Any]) -> None:
    data = obj.get("data") or {}
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError):
            raise ApiError(400, "BadRequest", f"data[{key}]: illegal base64 data") from None
    if obj.get("type") == "kubernetes.io/tls":
        for key in ("tls.crt", "tls.key"):
            if key not in data:
                raise ApiError(422, "Invalid", f"Secret is invalid: data[{key}]: Required value")


def _validate_webhook(index: int, webhook: Mapping[str, Any]) -> None:
    where = f"webhooks[{index}]"
    if not webhook.get("clientConfig", {}).get("service") and \
            not webhook.get("clientConfig", {}).get("url"):
        raise ApiError(422, "Invalid", f"{where}.clientConfig: Required value")
    bundle = webhook["clientConfig"].get("caBundle")
    if bundle is not None:
        try:
            base64.b64decode(bundle, validate=True)
        except (binascii.Error, TypeError):
            raise ApiError(400, "BadRequest", f"{where}.clientConfig.caBundle: illegal base64 "
                                              "data") from None
