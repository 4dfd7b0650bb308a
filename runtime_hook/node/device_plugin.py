"""vcuda's device plugin (kubelet device plugin API v1beta1): hands each container exactly the
GPUs its pod was bound with, for ``vcuda.io/shared-gpu`` and ``vcuda.io/gpu``.

kubelet never tells a device plugin which pod it allocates for, and picks the device IDs
itself. So the IDs here are opaque slots, and the GPU behind a slot is decided when kubelet
has recorded who holds it: ``Allocate`` answers a CDI device named after each slot;
``PreStartContainer`` (kubelet calls it before it asks the runtime to create the container)
asks kubelet's pod resources API which pod's container holds these slots, reads that pod's
assignment from the node's GPU ledger, and writes the slot's CDI spec: the bind mounts of
``/dev/null`` at ``/var/run/nvidia-container-devices/<uuid>`` by which NVIDIA's container
runtime exposes a GPU and vcuda's hook learns it. The runtime resolves the CDI device when it
creates the container. No pod is guessed from its request size, and no lock spans pods: each
call finds its own container by the IDs kubelet gave it.

A slot whose holder is gone gets a new generation (a new ID) before kubelet can hand it out
again, so a runtime's cached spec of an old holder can never name a new holder's GPU.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

from runtime_hook.contract import SHARED_RESOURCE, WHOLE_RESOURCE, Gpu
from runtime_hook.device_assignment import DEVICE_LIST_DIR, DEVICE_LIST_SOURCE, ENV_NAME
from runtime_hook.node import cdi_files
from runtime_hook.node.logs import event

API_VERSION = "v1beta1"
CDI_KIND = "vcuda.io/gpu"
KUBELET_SOCKET = "kubelet.sock"
SLOTS_PER_GPU = {SHARED_RESOURCE: 100, WHOLE_RESOURCE: 1}  # a share is at least 1% of a GPU
_PREFIX = {SHARED_RESOURCE: "s", WHOLE_RESOURCE: "w"}
_ID = re.compile(r"([sw])(\d{4})-(\d{1,19})")  # <prefix><slot>-<generation>, as Slots.ids

# (resource, device IDs) -> the GPU UUID of each ID; raises Refusal with the reason.
Resolve = Callable[[str, list[str]], dict[str, str]]


def cdi_spec(device: str, gpu: str) -> dict[str, Any]:
    """The CDI spec that gives ``gpu`` to a container holding ``device``."""
    return cdi_files.spec(CDI_KIND, [{
        "name": device,
        "containerEdits": {
            "env": [f"{ENV_NAME}={DEVICE_LIST_DIR}"],
            "mounts": [{"hostPath": DEVICE_LIST_SOURCE,
                        "containerPath": f"{DEVICE_LIST_DIR}/{gpu}",
                        "options": ["ro", "nosuid", "noexec", "bind"]}],
        },
    }])


class Slots:
    """The device IDs one resource advertises: ``<s|w><slot>-<generation>``."""

    def __init__(self, resource: str, gpus: int, generation: int) -> None:
        self._prefix = _PREFIX[resource]
        self._generations = [generation] * (gpus * SLOTS_PER_GPU[resource])
        self._first = generation  # IDs of earlier generations are an earlier agent's
        self._issued = dict(enumerate(self._generations))  # slot -> latest generation given
        self.changed = threading.Condition()
        self.version = 0

    def ids(self) -> list[str]:
        return [f"{self._prefix}{slot:04d}-{gen}" for slot, gen in enumerate(self._generations)]

    def refusal(self, ids: list[str]) -> str | None:
        """Why kubelet may not ask for ``ids``, or None: each must be an ID this plugin gave
        out, and none twice. Given out: a generation up to the latest of a slot advertised
        since this agent started (kubelet keeps the IDs of pods admitted before a retirement
        or before the GPUs changed), or of an earlier agent (before a restart, whose slots
        this one cannot know). Only such an ID ever becomes part of a file name."""
        seen: set[str] = set()
        with self.changed:
            for device in ids:
                if not self._gave_out(device):
                    return (f"device ID {device[:80]!r} is not one this plugin gave out (its "
                            f"IDs are {self._prefix}<slot, 4 digits>-<generation>)")
                if device in seen:
                    return f"device ID {device!r} is asked for more than once"
                seen.add(device)
        return None

    def _gave_out(self, device: str) -> bool:
        match = _ID.fullmatch(device)
        if match is None or match[1] != self._prefix:
            return False
        slot, generation = int(match[2]), int(match[3])
        return generation < self._first or generation <= self._issued.get(slot, -1)

    def resize(self, gpus: int, resource: str, generation: int, per_gpu: int = 0) -> None:
        """Advertise the slots of ``gpus`` GPUs (new slots start at ``generation``), ``per_gpu``
        each (0: the resource's :data:`SLOTS_PER_GPU`)."""
        wanted = gpus * (per_gpu or SLOTS_PER_GPU[resource])
        with self.changed:
            if wanted == len(self._generations):
                return
            del self._generations[wanted:]
            for slot in range(len(self._generations), wanted):
                self._generations.append(generation)
                self._issued[slot] = max(self._issued.get(slot, generation), generation)
            self._bump()

    def retire(self, ids: Iterable[str]) -> None:
        """Give each of ``ids`` (if still advertised) a new generation."""
        with self.changed:
            current = set(self.ids())
            retired = False
            for device in ids:
                if device in current:
                    slot = int(device[1:].split("-")[0])
                    self._generations[slot] += 1
                    self._issued[slot] = max(self._issued[slot], self._generations[slot])
                    retired = True
            if retired:
                self._bump()

    def _bump(self) -> None:
        self.version += 1
        self.changed.notify_all()


class DevicePlugin:
    """The DevicePlugin service of one resource, served on its own socket."""

    def __init__(self, resource: str, slots: Slots, resolve: Resolve, cdi_dir: str,
                 log: logging.Logger) -> None:
        self.resource = resource
        self.slots = slots
        self._resolve = resolve
        self._cdi_dir = cdi_dir
        self._log = log
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()
        with self.slots.changed:
            self.slots.changed.notify_all()

    # --- the service ------------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return _messages().DevicePluginOptions(pre_start_required=True,
                                               get_preferred_allocation_available=False)

    def ListAndWatch(self, request: Any, context: Any) -> Any:
        messages = _messages()
        seen = -1
        while not self._stopping.is_set() and context.is_active():
            with self.slots.changed:
                if self.slots.version == seen:
                    self.slots.changed.wait(timeout=1.0)
                    continue
                seen = self.slots.version
                ids = self.slots.ids()
            yield messages.ListAndWatchResponse(
                devices=[messages.Device(ID=device, health="Healthy") for device in ids])

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        messages = _messages()
        return messages.PreferredAllocationResponse(container_responses=[
            messages.ContainerPreferredAllocationResponse(
                deviceIDs=list(r.must_include_deviceIDs) + [
                    d for d in r.available_deviceIDs if d not in r.must_include_deviceIDs
                ][:max(r.allocation_size - len(r.must_include_deviceIDs), 0)])
            for r in request.container_requests])

    def Allocate(self, request: Any, context: Any) -> Any:
        messages = _messages()
        for r in request.container_requests:
            self._check_ids("allocate_refused", list(r.devices_ids), context)
        return messages.AllocateResponse(container_responses=[
            messages.ContainerAllocateResponse(cdi_devices=[
                messages.CDIDevice(name=f"{CDI_KIND}={device}") for device in r.devices_ids])
            for r in request.container_requests])

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        import grpc

        from runtime_hook.node.bound_gpus import Refusal

        ids = list(request.devices_ids)
        self._check_ids("prestart_refused", ids, context)
        try:
            gpus = self._resolve(self.resource, ids)
            for device in ids:
                self._write_spec(device, gpus[device])
        except (Refusal, OSError) as exc:
            event(self._log, logging.WARNING, "prestart_refused", resource=self.resource,
                  devices=ids, error=str(exc))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"vcuda: {exc}")
        event(self._log, logging.INFO, "prestart", resource=self.resource,
              devices=dict(sorted(gpus.items())))
        return _messages().PreStartContainerResponse()

    def _check_ids(self, name: str, ids: list[str], context: Any) -> None:
        """Abort the call when ``ids`` are not what this plugin handed kubelet."""
        import grpc

        reason = self.slots.refusal(ids)
        if reason is not None:
            shown = [device[:80] for device in ids[:10]]
            event(self._log, logging.WARNING, name, resource=self.resource, devices=shown,
                  error=reason)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"vcuda: {self.resource}: {reason}")

    # --- CDI specs --------------------------------------------------------------------------

    def spec_path(self, device: str) -> str:
        return cdi_files.spec_path(self._cdi_dir, CDI_KIND, device)

    def written(self) -> list[str]:
        """The device IDs of this resource whose CDI spec is on disk."""
        prefix = cdi_files.file_prefix(CDI_KIND)
        try:
            names = os.listdir(self._cdi_dir)
        except FileNotFoundError:
            return []
        return [n[len(prefix):-len(".json")] for n in names
                if n.startswith(prefix + _PREFIX[self.resource]) and n.endswith(".json")]

    def _write_spec(self, device: str, gpu: str) -> None:
        cdi_files.write(self.spec_path(device), cdi_spec(device, gpu))


_MESSAGES: Any = None


def _messages() -> Any:
    global _MESSAGES
    if _MESSAGES is None:
        from runtime_hook.node.protos import load

        _MESSAGES = load("deviceplugin")[0]
    return _MESSAGES


class Served:
    """One plugin on its socket in kubelet's device-plugins folder, registered with kubelet.

    ``start`` and ``stop`` may be called from any thread: a lock keeps one from running into
    the other, and a server is only ever the one its own call made."""

    def __init__(self, plugin: DevicePlugin, plugin_dir: str, log: logging.Logger) -> None:
        self.plugin = plugin
        self._dir = plugin_dir
        self._log = log
        name = plugin.resource.replace("/", "-").replace(".", "-")
        self.endpoint = f"{name}.sock"
        self.socket = os.path.join(plugin_dir, self.endpoint)
        self._lock = threading.Lock()
        self._server: Any = None
        self._stopped = False

    def start(self) -> None:
        """Serve on the socket and register with kubelet. A server already running is stopped
        first (kubelet removed its socket when it restarted; kubelet cannot reach it any
        more). RuntimeError when kubelet refuses or does not answer the registration: nothing
        is served then, so the next call tries again."""
        import grpc

        from runtime_hook.node.protos import load

        _, services = load("deviceplugin")
        with self._lock:
            if self._stopped:
                raise RuntimeError(f"the device plugin of {self.plugin.resource} was stopped")
            self._stop_server(grace=0)
            if os.path.exists(self.socket):
                os.unlink(self.socket)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            services.add_DevicePluginServicer_to_server(self.plugin, server)
            server.add_insecure_port(f"unix://{self.socket}")
            server.start()
            try:
                self._register()
            except grpc.RpcError as exc:
                server.stop(grace=0).wait()
                raise RuntimeError(f"registering {self.plugin.resource} with kubelet "
                                   f"({os.path.join(self._dir, KUBELET_SOCKET)}): "
                                   f"{exc.code().name} {exc.details()}") from None
            self._server = server

    def alive(self) -> bool:
        """False when kubelet removed the socket (it does when it restarts)."""
        return self._server is not None and os.path.exists(self.socket)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self.plugin.stop()
            self._stop_server(grace=1)

    def _stop_server(self, grace: float) -> None:
        if self._server is not None:
            self._server.stop(grace=grace).wait()
            self._server = None

    def _register(self) -> None:
        import grpc

        from runtime_hook.node.protos import load

        messages, services = load("deviceplugin")
        with grpc.insecure_channel(f"unix://{os.path.join(self._dir, KUBELET_SOCKET)}") as channel:
            services.RegistrationStub(channel).Register(messages.RegisterRequest(
                version=API_VERSION, endpoint=self.endpoint, resource_name=self.plugin.resource,
                options=messages.DevicePluginOptions(pre_start_required=True)), timeout=10)
        event(self._log, logging.INFO, "device_plugin_registered",
              resource=self.plugin.resource, socket=self.socket)


def slots_per_gpu(resource: str, gpu: Gpu) -> int:
    """The slots of ``resource`` one published GPU gives: one for each container it may take
    (its cap on sharers, else one a percent of its time), or one whole."""
    if resource == WHOLE_RESOURCE:
        return 1
    return gpu.sharers or gpu.cores


def first_generation() -> int:
    """Generations start from the clock, so a restarted plugin never reuses an ID."""
    return int(time.time() * 1000)
