"""The DRA driver's Kubernetes calls: read ResourceClaims, read and write its ResourceSlice."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from runtime_hook.hook_errors import NodeError
from runtime_hook.kube_credentials import CredentialsError, api_client

_FIX_RBAC = ("grant it with manifests/dra/rbac.yaml (get resourceclaims; get, create, update "
             "resourceslices) and manifests/base/node-rbac.yaml (get nodes)")


class DraApiError(NodeError, RuntimeError):
    """A call failed; the message says which and why, ``fix`` what to do."""

    fix = "check that the API server is reachable from the node"


class DraApi:
    """``resource.k8s.io/v1`` claims and slices through the ``kubernetes`` client."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        from kubernetes import client

        try:
            connection = api_client(kubeconfig)
        except CredentialsError as exc:
            raise DraApiError(str(exc), exc.fix) from None
        self.client = connection  # shared with the node's Event recorder
        self._api = client.ResourceV1Api(connection)
        self._core = client.CoreV1Api(connection)

    def node_uid(self, name: str) -> str:
        """The UID of the Node ``name``."""
        node = self._json(f"get node {name}", lambda: self._core
                          .read_node(name, _preload_content=False))
        return str(node["metadata"]["uid"])

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim ``namespace/name`` as JSON."""
        return self._json(f"get resourceclaim {namespace}/{name}", lambda: self._api
                          .read_namespaced_resource_claim(name, namespace, _preload_content=False))

    def slice(self, name: str) -> dict[str, Any] | None:
        """The ResourceSlice ``name``, or None when there is none."""
        try:
            return self._json(f"get resourceslice {name}", lambda: self._api
                              .read_resource_slice(name, _preload_content=False))
        except KubeNotFound:
            return None

    def create_slice(self, body: Any) -> None:
        """Create the ResourceSlice ``body``."""
        name = body["metadata"]["name"]
        self._json(f"create resourceslice {name}", lambda: self._api
                   .create_resource_slice(body, _preload_content=False))

    def replace_slice(self, body: Any) -> None:
        """Replace the ResourceSlice ``body`` (its metadata holds the resourceVersion read)."""
        name = body["metadata"]["name"]
        self._json(f"update resourceslice {name}", lambda: self._api
                   .replace_resource_slice(name, body, _preload_content=False))

    def _json(self, what: str, call: Callable[[], Any]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return json.loads(call().data)
        except ApiException as exc:
            reason = _message(exc)
            if exc.status == 404:
                raise KubeNotFound(f"cannot {what}: not found") from None
            if exc.status == 403:
                raise DraApiError(f"not allowed to {what}: {reason}", _FIX_RBAC) from None
            raise DraApiError(f"cannot {what}: HTTP {exc.status}: {reason}") from None
        except HTTPError as exc:
            raise DraApiError(f"cannot reach the API server to {what}: {exc}") from None


class KubeNotFound(DraApiError):
    """The object asked for does not exist."""


def _message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body or "")["message"])
    except (ValueError, KeyError, TypeError):
        return str(exc.reason or exc.body or "no message")
