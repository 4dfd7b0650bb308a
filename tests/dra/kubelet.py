"""Kubelet's side of a DRA plugin: its plugin watcher's registration, then Prepare and Unprepare.

As kubelet does it: find the plugin's socket in ``plugins_registry/``, call
``GetInfo``, check the type, the name and that ``v1.DRAPlugin`` is offered,
answer with ``NotifyRegistrationStatus``, then call the DRA service at the
endpoint the plugin gave, over gRPC on a unix socket.
"""

from __future__ import annotations

import os
import time
from typing import Any

import grpc

from runtime_hook.node.protos import load

DRIVER = "vcuda.io"


class RegistrationRefused(RuntimeError):
    """The plugin's answer to GetInfo is not one kubelet accepts."""


class FakeKubelet:
    """Kubelet of a node whose root is at ``host_root``, its directory ``kubelet_dir`` there."""

    def __init__(self, host_root: str, kubelet_dir: str = "/var/lib/kubelet") -> None:
        self._host_root = host_root
        self.registry = self._here(os.path.join(kubelet_dir, "plugins_registry"))
        self._channels: list[grpc.Channel] = []
        self._dra: Any = None
        self.info: Any = None

    def register(self, timeout: float = 10.0) -> Any:
        """Register the plugin whose socket appears in the registry; return its PluginInfo."""
        messages, services = load("pluginregistration")
        socket = self._wait_for_socket(timeout)
        stub = services.RegistrationStub(self._channel(socket))
        info = stub.GetInfo(messages.InfoRequest(), timeout=5)
        error = _check(info)
        stub.NotifyRegistrationStatus(
            messages.RegistrationStatus(plugin_registered=not error, error=error), timeout=5)
        if error:
            raise RegistrationRefused(error)
        _, dra_services = load("dra")
        self._dra = dra_services.DRAPluginStub(self._channel(self._here(info.endpoint)))
        self.info = info
        return info

    def prepare(self, *claims: dict[str, Any]) -> dict[str, Any]:
        """NodePrepareResources for claim objects; the answer per claim UID."""
        messages, _ = load("dra")
        request = messages.NodePrepareResourcesRequest(claims=[_claim(messages, c) for c in claims])
        return dict(self._dra.NodePrepareResources(request, timeout=10).claims)

    def unprepare(self, *claims: dict[str, Any]) -> dict[str, Any]:
        """NodeUnprepareResources for claim objects; the answer per claim UID."""
        messages, _ = load("dra")
        request = messages.NodeUnprepareResourcesRequest(
            claims=[_claim(messages, c) for c in claims])
        return dict(self._dra.NodeUnprepareResources(request, timeout=10).claims)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self._channels.clear()

    def _wait_for_socket(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = sorted(n for n in os.listdir(self.registry) if n.endswith(".sock")) \
                if os.path.isdir(self.registry) else []
            if found:
                return os.path.join(self.registry, found[0])
            time.sleep(0.05)
        raise TimeoutError(f"no plugin socket appeared in {self.registry}")

    def _channel(self, path: str) -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix://{path}")
        grpc.channel_ready_future(channel).result(timeout=5)
        self._channels.append(channel)
        return channel

    def _here(self, node_path: str) -> str:
        return os.path.join(self._host_root, node_path.lstrip("/"))


def _check(info: Any) -> str:
    if info.type != "DRAPlugin":
        return f"plugin type {info.type!r} is not DRAPlugin"
    if info.name != DRIVER:
        return f"plugin name {info.name!r} is not the driver {DRIVER}"
    if "v1.DRAPlugin" not in info.supported_versions:
        return f"none of {list(info.supported_versions)} is a DRA service version kubelet speaks"
    if not os.path.isabs(info.endpoint):
        return f"endpoint {info.endpoint!r} is not an absolute path"
    return ""


def _claim(messages: Any, claim: dict[str, Any]) -> Any:
    metadata = claim["metadata"]
    return messages.Claim(namespace=metadata["namespace"], uid=metadata["uid"],
                          name=metadata["name"])
