"""The API calls of `vcuda-certs`: the webhook Secret and the webhook configuration's caBundle.

Objects go in and out as plain dicts in the API's own JSON shape. Errors come
out as `ClusterError`s whose message says what to do: `Forbidden` names the
verb and resource the service account lacks, `Conflict` means somebody else
wrote first (the caller reads again and retries).
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from webhook.errors import WebhookError

_TRANSIENT = {429, 500, 502, 503, 504}
_SMP = "application/strategic-merge-patch+json"


class ClusterError(WebhookError, RuntimeError):
    """An API call failed; the message is for the operator."""


class Forbidden(ClusterError):
    """The service account lacks a permission (RBAC)."""


class Conflict(ClusterError):
    """The object changed since it was read, or was created by somebody else meanwhile."""


@dataclass(frozen=True)
class Target:
    """The objects the tool manages."""

    namespace: str
    secret: str
    webhook_config: str


class Cluster:
    """Reads and writes the webhook Secret and caBundle through the kubernetes client."""

    def __init__(self, api_client: client.ApiClient, target: Target,
                 sleep: Callable[[float], None], attempts: int = 4) -> None:
        self.target = target
        self._core = client.CoreV1Api(api_client)
        self._admission = client.AdmissionregistrationV1Api(api_client)
        self._plain = api_client.sanitize_for_serialization
        self._sleep = sleep
        self._attempts = attempts

    def read_secret(self) -> dict[str, Any] | None:
        """The webhook Secret, or None if it does not exist."""
        t = self.target
        try:
            return self._call("get", "secrets", t.secret, lambda: self._core.read_namespaced_secret(
                t.secret, t.namespace))
        except _NotFound:
            return None

    def create_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]:
        """Create the webhook Secret; `Conflict` if it exists already."""
        t = self.target
        return self._call("create", "secrets", t.secret,
                          lambda: self._core.create_namespaced_secret(
                              t.namespace, dict(secret)))  # type: ignore[arg-type]  # as JSON

    def replace_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the webhook Secret; `Conflict` if its resourceVersion is stale."""
        t = self.target
        return self._call("update", "secrets", t.secret,
                          lambda: self._core.replace_namespaced_secret(
                              t.secret, t.namespace, dict(secret)))  # type: ignore[arg-type]

    def read_webhook_config(self) -> dict[str, Any]:
        """The MutatingWebhookConfiguration; a `ClusterError` if it is missing."""
        name = self.target.webhook_config
        try:
            config = self._call("get", "mutatingwebhookconfigurations", name,
                                lambda: self._admission.read_mutating_webhook_configuration(name))
        except _NotFound:
            raise ClusterError(
                f"MutatingWebhookConfiguration {name!r} does not exist: apply manifests/ "
                "first (kubectl apply -k manifests/), or pass --webhook-config") from None
        if not config.get("webhooks"):
            raise ClusterError(f"MutatingWebhookConfiguration {name!r} has no webhooks to "
                               "give a caBundle: is it the one of manifests/?")
        return config

    def write_ca_bundle(self, config: Mapping[str, Any], bundle: bytes) -> dict[str, Any]:
        """Set every webhook's caBundle of ``config`` to ``bundle``.

        A strategic merge patch keyed by webhook name, carrying the
        resourceVersion that was read: `Conflict` if the configuration changed.
        """
        encoded = base64.b64encode(bundle).decode()
        patch = {
            "metadata": {"resourceVersion": config["metadata"]["resourceVersion"]},
            "webhooks": [{"name": w["name"], "clientConfig": {"caBundle": encoded}}
                         for w in config.get("webhooks") or []],
        }
        name = self.target.webhook_config
        return self._call("patch", "mutatingwebhookconfigurations", name,
                          lambda: self._admission.patch_mutating_webhook_configuration(
                              name, patch, _content_type=_SMP))

    def _call(self, verb: str, resource: str, name: str, call: Callable[[], Any]) -> dict[str, Any]:
        """Run one API call: retry transient failures, translate errors into ClusterErrors."""
        for attempt in range(1, self._attempts + 1):
            try:
                return self._plain(call())
            except ApiException as error:
                status, message = error.status, _status_message(error)
                if status in _TRANSIENT and attempt < self._attempts:
                    self._sleep(2.0 ** (attempt - 1))
                    continue
                raise self._translate(verb, resource, name, status, message) from None
            except HTTPError as error:
                if attempt < self._attempts:
                    self._sleep(2.0 ** (attempt - 1))
                    continue
                raise ClusterError(f"cannot reach the API server to {verb} {resource} "
                                   f"{name!r}: {error}") from None
        raise AssertionError("unreachable")

    def _translate(self, verb: str, resource: str, name: str, status: int | None,
                   message: str) -> Exception:
        where = "" if resource == "mutatingwebhookconfigurations" else \
            f" in namespace {self.target.namespace!r}"
        if status == 404:
            return _NotFound(message)
        if status == 403:
            return Forbidden(
                f"missing RBAC permission: cannot {verb} {resource} {name!r}{where}. Grant "
                f"verb {verb!r} on resource {resource!r} to this service account "
                f"(manifests/base/certs-rbac.yaml does). API server: {message}")
        if status == 401:
            return ClusterError(f"the API server rejected the credentials: {message}")
        if status == 409:
            return Conflict(f"{resource} {name!r} changed meanwhile ({message})")
        return ClusterError(f"cannot {verb} {resource} {name!r}{where}: HTTP {status}: {message}")


class _NotFound(ClusterError):
    pass


def _status_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(error.reason or error.body or "no message")


class DryRun:
    """Reads the cluster once, then keeps every write in memory: shows what a run would do."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._secret: dict[str, Any] | None = None
        self._config: dict[str, Any] | None = None
        self._read = False

    def read_secret(self) -> dict[str, Any] | None:
        """The Secret as the writes so far would have left it."""
        self._load()
        return copy.deepcopy(self._secret)

    def read_webhook_config(self) -> dict[str, Any]:
        """The webhook configuration as the writes so far would have left it."""
        self._load()
        return copy.deepcopy(self._config) or {}

    def create_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]:
        """Keep ``secret`` as if created."""
        self._load()
        self._secret = copy.deepcopy(dict(secret))
        return self.read_secret() or {}

    def replace_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]:
        """Keep ``secret`` as if replaced."""
        return self.create_secret(secret)

    def write_ca_bundle(self, config: Mapping[str, Any], bundle: bytes) -> dict[str, Any]:
        """Keep the caBundle as if patched."""
        self._load()
        assert self._config is not None
        for webhook in self._config.get("webhooks") or []:
            webhook.setdefault("clientConfig", {})["caBundle"] = base64.b64encode(bundle).decode()
        return self.read_webhook_config()

    def _load(self) -> None:
        if not self._read:
            self._secret = self._cluster.read_secret()
            self._config = self._cluster.read_webhook_config()
            self._read = True
