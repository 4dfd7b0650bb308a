"""The kubelet plugin: registration on kubelet's plugin socket, and the DRA service on its own.

Kubelet watches ``<kubelet dir>/plugins_registry/`` for sockets; on ours it
calls ``GetInfo`` (a ``DRAPlugin`` named ``vcuda.io`` that speaks
``v1.DRAPlugin`` at ``<kubelet dir>/plugins/vcuda.io/dra.sock``) and then
``NotifyRegistrationStatus``. Before a pod's containers start it calls
``NodePrepareResources`` with the pod's claims (namespace, UID, name); the
plugin reads each claim's allocation from the API and prepares it. After the
pod it calls ``NodeUnprepareResources``. Each claim gets its own answer: one
that fails does not fail the others, and kubelet retries it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from typing import Any

from runtime_hook.hook_errors import NodeError
from runtime_hook.node.dra.prepare import Preparer
from runtime_hook.node.dra.slices import DRIVER
from runtime_hook.node.host_root import host_path
from runtime_hook.node.logs import event
from runtime_hook.node.protos import load

PLUGIN_TYPE = "DRAPlugin"
SERVICE_VERSION = "v1.DRAPlugin"
DEFAULT_KUBELET_DIR = "/var/lib/kubelet"
CALLS = ("prepare", "unprepare")  # kubelet's calls for a claim, as metrics and logs name them
_WORKERS = 4
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, the last one NUL

ClaimReader = Callable[[str, str], dict[str, Any]]  # (namespace, name) -> the claim object


def registration_socket(kubelet_dir: str) -> str:
    """The node path of the socket kubelet's plugin watcher finds."""
    return os.path.join(kubelet_dir, "plugins_registry", f"{DRIVER}-reg.sock")


def service_socket(kubelet_dir: str) -> str:
    """The node path of the DRA service's socket."""
    return os.path.join(kubelet_dir, "plugins", DRIVER, "dra.sock")


class KubeletPlugin:
    """Both gRPC servers; :meth:`start` them, :meth:`stop` them (their sockets go too).

    ``host_root`` is where the node's root is mounted here; ``read_claim``
    fetches a claim from the API and raises RuntimeError when it cannot;
    ``on_registered`` is called each time kubelet accepts the plugin.
    """

    def __init__(self, preparer: Preparer, read_claim: ClaimReader, host_root: str,
                 kubelet_dir: str, log: logging.Logger,
                 on_registered: Callable[[], None] = lambda: None) -> None:
        self._preparer = preparer
        self._read_claim = read_claim
        self._on_registered = on_registered
        self._log = log
        self._endpoint = service_socket(kubelet_dir)
        self._sockets = (host_path(host_root, self._endpoint),
                         host_path(host_root, registration_socket(kubelet_dir)))
        self._servers: list[Any] = []
        self.registered: bool | None = None  # what kubelet said last; None: nothing yet
        self._failed: Counter[str] = Counter()  # claims whose call failed, by call
        self._failed_lock = threading.Lock()  # kubelet's calls come in on several threads

    def start(self) -> None:
        """Serve the DRA service, then offer the registration socket to kubelet."""
        import grpc

        dra, dra_services = load("dra")
        reg, reg_services = load("pluginregistration")
        plugin = self
        # The generated servicer classes, untyped: bases made at run time.
        service_base: Any = dra_services.DRAPluginServicer
        registration_base: Any = reg_services.RegistrationServicer

        class Service(service_base):
            def NodePrepareResources(self, request: Any, context: Any) -> Any:
                return plugin._prepare_all(dra, request)

            def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
                return plugin._unprepare_all(dra, request)

        class Registration(registration_base):
            def GetInfo(self, request: Any, context: Any) -> Any:
                return reg.PluginInfo(type=PLUGIN_TYPE, name=DRIVER, endpoint=plugin._endpoint,
                                      supported_versions=[SERVICE_VERSION])

            def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
                plugin._registration_status(request.plugin_registered, request.error)
                return reg.RegistrationStatusResponse()

        for path, add, servicer in (
            (self._sockets[0], dra_services.add_DRAPluginServicer_to_server, Service()),
            (self._sockets[1], reg_services.add_RegistrationServicer_to_server, Registration()),
        ):
            if len(path.encode()) > _MAX_SOCKET_PATH:
                raise PluginError(f"socket path {path} is longer than a unix socket's "
                                  f"{_MAX_SOCKET_PATH} bytes",
                                  "mount the node's root at a shorter --host-root")
            os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
            _remove(path)  # left by an agent that was killed
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=_WORKERS))
            add(servicer, server)
            server.add_insecure_port(f"unix://{path}")
            server.start()
            self._servers.append(server)
        event(self._log, logging.INFO, "dra_plugin_serving", driver=DRIVER,
              endpoint=self._endpoint, registration=self._sockets[1])

    def stop(self) -> None:
        """Stop serving and remove both sockets (kubelet then unregisters the plugin)."""
        for server in reversed(self._servers):
            server.stop(grace=2).wait()
        self._servers.clear()
        for path in self._sockets:
            _remove(path)

    # --- the calls --------------------------------------------------------------------------

    def _prepare_all(self, dra: Any, request: Any) -> Any:
        answer = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            result = answer.claims[claim.uid]
            try:
                prepared = self._preparer.prepare(
                    claim.uid, self._read_claim(claim.namespace, claim.name))
            except Exception as exc:  # each claim gets its own answer, whatever went wrong
                result.error = _line(exc)
                self._failure("prepare", claim, result.error)
                continue
            for device in prepared:
                result.devices.add(request_names=device.requests, pool_name=device.pool,
                                   device_name=device.device, cdi_device_ids=device.cdi_ids)
            self._said("claim_prepared", claim, logging.INFO,
                       devices=[d.device for d in prepared])
        return answer

    def _unprepare_all(self, dra: Any, request: Any) -> Any:
        answer = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            result = answer.claims[claim.uid]
            try:
                self._preparer.unprepare(claim.uid)
            except Exception as exc:  # each claim gets its own answer, whatever went wrong
                result.error = _line(exc)
                self._failure("unprepare", claim, result.error)
                continue
            self._said("claim_unprepared", claim, logging.INFO)
        return answer

    def failures(self) -> dict[str, int]:
        """How many claims failed to prepare and to unprepare since the start, by call."""
        with self._failed_lock:
            return {call: self._failed[call] for call in CALLS}

    def _failure(self, call: str, claim: Any, error: str) -> None:
        with self._failed_lock:
            self._failed[call] += 1
        self._said(f"claim_{call}_failed", claim, logging.WARNING, error=error)

    def _registration_status(self, registered: bool, error: str) -> None:
        self.registered = registered
        if registered:
            event(self._log, logging.INFO, "dra_plugin_registered", driver=DRIVER)
            self._on_registered()
        else:
            event(self._log, logging.ERROR, "dra_plugin_refused", driver=DRIVER, error=error)

    def _said(self, name: str, claim: Any, level: int, **fields: Any) -> None:
        event(self._log, level, name, claim=f"{claim.namespace}/{claim.name}", uid=claim.uid,
              **fields)


class PluginError(NodeError, RuntimeError):
    """The plugin cannot serve kubelet; the message says why."""


def with_fix(exc: Exception) -> str:
    """``exc``'s message, then its fix where it has one."""
    fix = getattr(exc, "fix", "")
    return f"{exc}; fix: {fix}" if fix else str(exc)


def _line(exc: Exception) -> str:
    """The one line kubelet records for a claim that failed: the error's message and fix, or
    for a fault of the plugin's own (no NodeError, no OSError) what it was."""
    if isinstance(exc, (NodeError, OSError)):
        return f"vcuda: {with_fix(exc)}"
    return (f"vcuda: the plugin failed on this claim ({type(exc).__name__}: {str(exc)[:200]}); "
            "fix: report it with the node agent's log; kubelet tries again")


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
