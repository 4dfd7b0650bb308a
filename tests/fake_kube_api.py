"""A local HTTPS server with the Kubernetes API's semantics, for the endpoints a test gives it.

No real API server can run on the CI machines. This one does what every
endpoint shares: real TLS with its own CA, a kubeconfig that trusts it, a
bearer token (401 without it), RBAC evaluated from Role/ClusterRole rules
(403 with the API's message), objects stamped with a resourceVersion from
one counter bumped on every write as etcd does, and errors answered as
`Status` objects. An answer may be a stream (:class:`Streamed`, a watch), sent
in HTTP/1.1 chunks as it comes. Subclasses implement :meth:`FakeKubeApi.route` for the
resources they serve (``tests/deploy/fake_apiserver.py``: Secrets and
webhook configurations; ``tests/node/fake_nodes_api.py``: nodes).
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from webhook import pki

MERGE_PATCH = "application/merge-patch+json"


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
    body: bytes = b""
    query: str = ""
    accept: str = ""


@dataclass
class Streamed:
    """An answer sent piece by piece as ``chunks`` yields them (a watch's events)."""

    chunks: Iterator[bytes]


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


def conflict(resource: str, name: str) -> ApiError:
    """The 409 the API answers a write based on a stale resourceVersion."""
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again")


def json_body(body: bytes, kind: type = dict) -> Any:
    """The request body as JSON of ``kind`` (an object, or a list for a JSON Patch); 400 else."""
    try:
        value = json.loads(body)
    except ValueError:
        raise ApiError(400, "BadRequest", "the request body is not JSON") from None
    if not isinstance(value, kind):
        raise ApiError(400, "BadRequest", f"the request body is not a JSON {kind.__name__}")
    return value


class FakeKubeApi:
    """The server; `start` it, point a kubeconfig at `url`, `stop` it.

    Attributes:
        objects: stored objects by API path.
        requests: every request served, in order.
        rules: RBAC rules of the token's service account; None allows everything.
        subject: the user that 403 messages name.
        before_write: called before each write is applied, e.g. to play a
            concurrent writer.
    """

    def __init__(self, subject: str, token: str = "test-token", keep_alive: bool = False) -> None:
        self.subject = subject
        self.keep_alive = keep_alive  # HTTP/1.1 connections kept open, as the API server does
        self.token = token
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.rules: list[Rule] | None = None
        self.before_write: Callable[[str], None] | None = None
        self.local = threading.local()  # .query, .accept: of this thread's request
        self._revision = 0
        self.lock = threading.RLock()  # held to read, check and write; before_write may bump()
        self.ca = pki.make_ca("fake API server CA")
        self._pair = pki.issue_serving_cert(self.ca, ["localhost"], self.ca.certificate
                                            .not_valid_before_utc, self.ca.certificate
                                            .not_valid_after_utc, ip_addresses=["127.0.0.1"])
        self._httpd: ThreadingHTTPServer | None = None
        self.stopping = threading.Event()  # streams in progress end

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
            protocol_version = "HTTP/1.1" if server.keep_alive else "HTTP/1.0"

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
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
        with self.lock:
            self.store(path, copy.deepcopy(dict(obj)))

    def get(self, path: str) -> dict[str, Any] | None:
        with self.lock:
            return copy.deepcopy(self.objects.get(path))

    def bump(self, path: str) -> None:
        """Write the object unchanged, as another client's update would: a new resourceVersion."""
        with self.lock:
            self.store(path, self.objects[path])

    def store(self, path: str, obj: dict[str, Any] | None) -> None:
        """Write ``obj`` at ``path`` with the next resourceVersion, or delete what is there
        (None; a deletion is a write too). Hold the lock."""
        before = self.objects.get(path)
        if obj is None:
            self._revision += 1
            self.objects.pop(path, None)
        else:
            self.objects[path] = self.stamp(obj)
        self.changed(path, before, obj)

    def changed(self, path: str, before: dict[str, Any] | None,
                after: dict[str, Any] | None) -> None:
        """Called under the lock after each :meth:`store` (for watches)."""

    def stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Give ``obj`` the next resourceVersion (and a uid and creation time if it has none)."""
        self._revision += 1
        metadata = obj.setdefault("metadata", {})
        metadata["resourceVersion"] = str(self._revision)
        metadata.setdefault("uid", str(uuid.uuid4()))
        metadata.setdefault("creationTimestamp", "2030-01-01T00:00:00Z")
        return obj

    # --- the API ----------------------------------------------------------------------------

    def handle(self, method: str, path: str, content_type: str, body: bytes,
               token: str | None) -> tuple[int, dict[str, Any] | Streamed]:
        if token != self.token:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return self.route(method, path, content_type, body)

    def route(self, method: str, path: str, content_type: str,
              body: bytes) -> tuple[int, dict[str, Any] | Streamed]:
        """Serve one authenticated request: (status, answer); raise ApiError to refuse it."""
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def authorize(self, verb: str, group: str, resource: str, namespace: str | None,
                  name: str | None) -> None:
        """403 unless a rule allows it."""
        # For create the name is not part of the request's attributes: resourceNames
        # rules never allow it, exactly as in the real authorizer.
        checked = None if verb == "create" else name
        if self.rules is None or any(r.allows(verb, group, resource, namespace, checked)
                                     for r in self.rules):
            return
        where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        raise ApiError(403, "Forbidden",
                       f'{resource} "{name or ""}" is forbidden: User "{self.subject}" cannot '
                       f'{verb} resource "{resource}" in API group "{group}" {where}')

    def read(self, path: str, resource: str, name: str) -> dict[str, Any]:
        """The object at ``path``; 404 naming ``resource`` and ``name`` when there is none."""
        with self.lock:
            if path not in self.objects:
                raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
            return copy.deepcopy(self.objects[path])

    def about_to_write(self, path: str) -> None:
        """Call before applying a write (hold the lock)."""
        if self.before_write:
            self.before_write(path)



class _Handler(BaseHTTPRequestHandler):
    api: FakeKubeApi
    # As kube-apiserver (Go's net/http sets TCP_NODELAY): the head and the body go out as two
    # writes, and with Nagle's algorithm the body waited for the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
        path, _, query = self.path.partition("?")
        self.api.local.query = parse_qs(query)
        self.api.local.accept = self.headers.get("Accept", "")
        content_type = self.headers.get("Content-Type", "")
        try:
            status, answer = self.api.handle(self.command, path, content_type, body, token)
        except ApiError as error:
            status, answer = error.code, {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": error.message, "reason": error.reason, "code": error.code}
        self.api.requests.append(Request(self.command, path, content_type, status, body,
                                         query, self.api.local.accept))
        if isinstance(answer, Streamed):
            self._stream(status, answer)
            return
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, status: int, answer: Streamed) -> None:
        chunked = self.protocol_version == "HTTP/1.1"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.close_connection = True
        self.end_headers()
        try:
            for chunk in answer.chunks:
                if not chunk:
                    continue  # an empty chunk would end the answer
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                self.wfile.flush()
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve
