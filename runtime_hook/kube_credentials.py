"""Kubernetes credentials, one way for every component that calls the API (node agent, DRA
driver, extender, certificate tool): the kubeconfig given, else the pod's service account."""

from __future__ import annotations

import os

from runtime_hook.hook_errors import NodeError

TYPE_CHECKING = False  # typing's, without importing typing (the contract is on the hook's path)
if TYPE_CHECKING:
    from typing import Any


class CredentialsError(NodeError, RuntimeError):
    """Neither a usable kubeconfig nor a service account; the message says which failed."""

    fix = "give --kubeconfig, or run the component in a pod with its service account"


def in_cluster(kubeconfig: str | None) -> bool:
    """Whether ``kubeconfig`` None means the pod's service account (we run in a pod)."""
    return kubeconfig is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def api_client(kubeconfig: str | None = None) -> Any:
    """A ``kubernetes`` ApiClient from ``kubeconfig``, else the pod's service account (else the
    default kubeconfig); raise CredentialsError when none can be loaded."""
    if kubeconfig is not None and not os.path.isfile(kubeconfig):
        # The kubernetes library would only say "Invalid kube-config file".
        raise CredentialsError(f"no Kubernetes credentials: {kubeconfig} is not a file")
    from kubernetes import client, config  # only a component that talks to Kubernetes pays

    try:
        if in_cluster(kubeconfig):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(config_file=kubeconfig)
    except (config.ConfigException, OSError) as exc:
        raise CredentialsError(f"no Kubernetes credentials: {exc}") from None
