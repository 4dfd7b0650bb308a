"""A local HTTPS server speaking the few endpoints of the Kubernetes API that `vcuda-certs` uses.

No real API server can run on the CI machines, so this one implements, with
the real API's semantics, exactly what the tool calls: get, create and replace
of Secrets; get and strategic-merge patch of MutatingWebhookConfigurations.
It answers with `Status` objects like the real server (404 NotFound, 409
AlreadyExists and Conflict on a stale resourceVersion, 401, 403 with RBAC
evaluated from Role/ClusterRole rules, 415 for patch types it does not
implement, 422 for invalid objects), and bumps one resourceVersion counter
on every write, as etcd does.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import re
import ssl
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from webhook import pki

SERVICE_ACCOUNT = "system:serviceaccount:vcuda-system:vcuda-certs"
_SECRET = re.compile(r"/api/v1/namespaces/([^/]+)/secrets(?:/([^/]+))?")
_MWC = re.compile(r"/apis/admissionregistration\.k8s\.io/v1/mutatingwebhookconfigurations/([^/]+)")
_SMP = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """An error answer: HTTP status, Status reason and message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass
class Request:
    """One request as the server saw it."""

    method: str
    path: str
    content_type: str
    status: int


@dataclass
class Rule:
    """One RBAC policy rule, scoped to a namespace (None: cluster-wide)."""

    namespace: str | None
    api_groups: list[str]
    resources: list[str]
    verbs: list[str]
    resource_names: list[str] = field(default_factory=list)

    def allows(self, verb: str, group: str, resource: str, namespace: str | None,
               name: str | None) -> bool:
        return ((self.namespace is None or self.namespace == namespace)
                and group in self.api_groups and resource in self.resources
                and verb in self.verbs
                and (not self.resource_names or name in self.resource_names))


def rules_from_manifests(objects: list[Mapping[str, Any]], subject: str) -> list[Rule]:
    """The rules bound to the service account ``subject`` by the given RBAC objects."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    rules = []
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        subjects = {f"system:serviceaccount:{s['namespace']}:{s['name']}"
                    for s in binding["subjects"] if s["kind"] == "ServiceAccount"}
        if subject not in subjects:
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace")
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])]
        rules += [Rule(scope, r["apiGroups"], r["resources"], r["verbs"],
                       r.get("resourceNames", [])) for r in role["rules"]]
    return rules


class FakeApiServer:
    """The server; `start` it, point a kubeconfig at `url`, `stop` it.

    Attributes:
        objects: stored objects by API path.
        requests: every request served, in order.
        rules: RBAC rules of the token's service account; None allows everything.
        before_write: called before each write is applied, e.g. to play a
            concurrent writer.
    """

    def __init__(self, token: str = "test-token") -> None:
        self.token = token
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.rules: list[Rule] | None = None
        self.before_write: Callable[[str], None] | None = None
        self._revision = 0
        self._lock = threading.RLock()  # before_write may call bump()
        self.ca = pki.make_ca("fake API server CA")
        self._pair = pki.issue_serving_cert(self.ca, ["localhost"], self.ca.certificate
                                            .not_valid_before_utc, self.ca.certificate
                                            .not_valid_after_utc, ip_addresses=["127.0.0.1"])
        self._httpd: ThreadingHTTPServer | None = None

    # --- lifecycle --------------------------------------------------------------------------

    def start(self, cert_dir: Any) -> None:
        """Listen on a free port of 127.0.0.1 (TLS files go to ``cert_dir``)."""
        cert, key = cert_dir / "apiserver.crt", cert_dir / "apiserver.key"
        cert.write_bytes(self._pair.certificate_pem)
        key.write_bytes(self._pair.key_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server = self

        class Handler(_Handler):
            api = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"https://127.0.0.1:{self._httpd.server_address[1]}"

    def kubeconfig(self, token: str | None = None) -> str:
        """A kubeconfig (YAML is JSON) that trusts this server and sends the token."""
        ca = base64.b64encode(self.ca.certificate_pem).decode()
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url,
                                                      "certificate-authority-data": ca}}],
            "users": [{"name": "test", "user": {"token": token or self.token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}],
        })

    # --- objects ----------------------------------------------------------------------------

    def put(self, path: str, obj: Mapping[str, Any]) -> None:
        """Store ``obj`` at ``path`` as if created."""
        with self._lock:
            self.objects[path] = self._stamp(copy.deepcopy(dict(obj)))

    def get(self, path: str) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self.objects.get(path))

    def bump(self, path: str) -> None:
        """Write the object unchanged, as another client's update would: a new resourceVersion."""
        with self._lock:
            self._stamp(self.objects[path])

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._revision += 1
        metadata = obj.setdefault("metadata", {})
        metadata["resourceVersion"] = str(self._revision)
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", "2030-01-01T00:00:00Z")
        return obj

    # --- the API ----------------------------------------------------------------------------

    def handle(self, method: str, path: str, content_type: str, body: bytes,
               token: str | None) -> tuple[int, dict[str, Any]]:
        if token != self.token:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        secret, mwc = _SECRET.fullmatch(path), _MWC.fullmatch(path)
        if secret:
            namespace, name = secret.groups()
            verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}[method]
            self._authorize(verb, "", "secrets", namespace, name)
            if method == "POST" and name is None:
                return 201, self._create_secret(namespace, _json(body))
            if name is None:
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            item = f"/api/v1/namespaces/{namespace}/secrets/{name}"
            if method == "GET":
                return 200, self._read(item, "secrets", name)
            if method == "PUT":
                return 200, self._replace_secret(item, name, namespace, _json(body))
            raise ApiError(405, "MethodNotAllowed", "not implemented by this test server")
        elif mwc:
            name = mwc.group(1)
            verb = {"GET": "get", "PATCH": "patch", "PUT": "update"}[method]
            self._authorize(verb, "admissionregistration.k8s.io",
                            "mutatingwebhookconfigurations", None, name)
            if method == "GET":
                return 200, self._read(path, "mutatingwebhookconfigurations", name)
            if method == "PATCH":
                return 200, self._patch_mwc(path, name, content_type, _json(body))
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _authorize(self, verb: str, group: str, resource: str, namespace: str | None,
                   name: str | None) -> None:
        # For create the name is not part of the request's attributes: resourceNames
        # rules never allow it, exactly as in the real authorizer.
        checked = None if verb == "create" else name
        if self.rules is None or any(r.allows(verb, group, resource, namespace, checked)
                                     for r in self.rules):
            return
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        raise ApiError(403, "Forbidden",
                       f'{resource} "{name or ""}" is forbidden: User "{SERVICE_ACCOUNT}" cannot '
                       f'{verb} resource "{resource}" in API group "{group}" {where}')

    def _read(self, path: str, resource: str, name: str) -> dict[str, Any]:
        with self._lock:
            if path not in self.objects:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            return copy.deepcopy(self.objects[path])

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
        with self._lock:
            self._before_write(path)
            if path in self.objects:
                raise ApiError(409, "AlreadyExists", f'secrets "{name}" already exists')
            obj["metadata"]["namespace"] = namespace
            self.objects[path] = self._stamp(obj)
            return copy.deepcopy(obj)

    def _replace_secret(self, path: str, name: str, namespace: str,
                        obj: dict[str, Any]) -> dict[str, Any]:
        if (obj.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name "
                                              "on the URL")
        _validate_secret(obj)
        with self._lock:
            current = self.objects.get(path)
            if current is None:
                raise ApiError(404, "NotFound", f'secrets "{name}" not found')
            self._before_write(path)
            current = self.objects[path]
            wanted = obj["metadata"].get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise _conflict("secrets", name)
            if obj.get("type", "Opaque") != current.get("type", "Opaque"):
                raise ApiError(422, "Invalid", "Secret is invalid: type: Invalid value: "
                                               "field is immutable")
            obj["metadata"].update(namespace=namespace, uid=current["metadata"]["uid"])
            self.objects[path] = self._stamp(obj)
            return copy.deepcopy(obj)

    def _patch_mwc(self, path: str, name: str, content_type: str,
                   patch: dict[str, Any]) -> dict[str, Any]:
        if content_type.split(";")[0].strip() != _SMP:
            raise ApiError(415, "UnsupportedMediaType",
                           f"this test server implements only {_SMP} (got {content_type})")
        with self._lock:
            current = self.objects.get(path)
            if current is None:
                raise ApiError(404, "NotFound",
                               f'mutatingwebhookconfigurations.admissionregistration.k8s.io '
                               f'"{name}" not found')
            self._before_write(path)
            current = self.objects[path]
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                raise _conflict("mutatingwebhookconfigurations.admissionregistration.k8s.io",
                                name)
            patched = _strategic_merge(current, patch)
            for i, webhook in enumerate(patched.get("webhooks") or []):
                _validate_webhook(i, webhook)
            self.objects[path] = self._stamp(patched)
            return copy.deepcopy(patched)

    def _before_write(self, path: str) -> None:
        if self.before_write:
            self.before_write(path)


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


def _conflict(resource: str, name: str) -> ApiError:
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again")


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        raise ApiError(400, "BadRequest", "the request body is not JSON") from None
    if not isinstance(value, dict):
        raise ApiError(400, "BadRequest", "the request body is not a JSON object")
    return value


class _Handler(BaseHTTPRequestHandler):
    api: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        path = self.path.split("?")[0]
        content_type = self.headers.get("Content-Type", "")
        try:
            status, answer = self.api.handle(self.command, path, content_type, body, token)
        except ApiError as error:
            status, answer = error.code, {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": error.message, "reason": error.reason, "code": error.code}
        self.api.requests.append(Request(self.command, path, content_type, status))
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = _serve
