"""kubelet's side of the device plugin and pod resources APIs, over their real gRPC sockets,
and the container runtime's CDI resolution: what a GPU node does to a pod between its
binding and its container's start.

As kubelet does, it serves ``Registration`` on ``kubelet.sock`` in the device-plugins folder,
dials each plugin that registers, follows its ``ListAndWatch``, picks device IDs for a
container itself (from the healthy IDs nobody holds, in an order the plugin does not choose),
calls ``Allocate``, records who holds what (served by ``PodResourcesLister.List``), and calls
``PreStartContainer`` before it creates the container. Creating resolves the CDI device names
that ``Allocate`` answered against the spec files, as containerd does, and reads the GPUs from
the spec's ``/var/run/nvidia-container-devices/<uuid>`` mounts, as NVIDIA's runtime does.
"""

from __future__ import annotations

import json
import os
import random
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from runtime_hook.contract import SHARED_RESOURCE, WHOLE_RESOURCE
from runtime_hook.device_assignment import DEVICE_LIST_DIR
from runtime_hook.node.protos import load

RESOURCES = (SHARED_RESOURCE, WHOLE_RESOURCE)


class StartError(RuntimeError):
    """A container could not be started; the message is what kubelet would report."""


@dataclass
class Held:
    """Devices one container of one pod holds, and the CDI names Allocate gave for them."""

    namespace: str
    pod: str
    container: str
    resource: str
    ids: list[str]
    cdi: list[str] = field(default_factory=list)


class FakeKubelet:
    """One node's kubelet, device-plugin side; ``start`` then ``admit``/``start_container``."""

    def __init__(self, plugin_dir: str, pod_resources: str, cdi_dir: str,
                 seed: int = 0) -> None:
        self.plugin_dir, self.pod_resources, self.cdi_dir = plugin_dir, pod_resources, cdi_dir
        self.devices: dict[str, list[str]] = {}
        self.held: list[Held] = []
        self.registered = threading.Event()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._random = random.Random(seed)
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, Any] = {}
        self._servers: list[grpc.Server] = []
        self._specs: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}
        self._dp, self._dp_services = load("deviceplugin")
        self._pr, self._pr_services = load("podresources")

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        os.makedirs(self.plugin_dir, exist_ok=True)
        os.makedirs(os.path.dirname(self.pod_resources), exist_ok=True)
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._dp_services.add_RegistrationServicer_to_server(_Registration(self), registration)
        registration.add_insecure_port(f"unix://{os.path.join(self.plugin_dir, 'kubelet.sock')}")
        lister = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self._pr_services.add_PodResourcesListerServicer_to_server(_Lister(self), lister)
        lister.add_insecure_port(f"unix://{self.pod_resources}")
        for server in (registration, lister):
            server.start()
            self._servers.append(server)

    def stop(self) -> None:
        for server in self._servers:
            server.stop(grace=0).wait()
        for channel in self._channels.values():
            channel.close()

    def restart(self) -> None:
        """As kubelet restarts: plugins' sockets are removed and they must register again."""
        for name in os.listdir(self.plugin_dir):
            if name != "kubelet.sock":
                os.unlink(os.path.join(self.plugin_dir, name))

    def connect(self, resource: str, endpoint: str) -> None:
        channel = grpc.insecure_channel(f"unix://{os.path.join(self.plugin_dir, endpoint)}")
        old = self._channels.get(resource)
        self._channels[resource] = channel
        self._stubs[resource] = self._dp_services.DevicePluginStub(channel)
        if old is not None:
            old.close()
        threading.Thread(target=self._watch, args=(resource, channel), daemon=True).start()

    def _watch(self, resource: str, channel: grpc.Channel) -> None:
        stub = self._dp_services.DevicePluginStub(channel)
        try:
            for answer in stub.ListAndWatch(self._dp.Empty()):
                with self._changed:
                    self.devices[resource] = [d.ID for d in answer.devices
                                              if d.health == "Healthy"]
                    self._changed.notify_all()
                self.registered.set()
        except grpc.RpcError:
            pass  # the plugin went away; it registers again when it comes back

    def wait_for_devices(self, resource: str, count: int, timeout: float = 30.0,
                         gone: str | None = None) -> None:
        """Until ``resource`` has ``count`` devices advertised, ``gone`` not among them."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: len(self.devices.get(resource, ())) >= count
                    and gone not in self.devices.get(resource, ()), timeout):
                raise TimeoutError(f"{resource}: {len(self.devices.get(resource, ()))} devices "
                                   f"advertised, {count} wanted"
                                   + (f", without {gone}" if gone else ""))

    # --- a pod's life -----------------------------------------------------------------------

    def admit(self, pod: dict[str, Any]) -> None:
        """Allocate devices to each container of ``pod`` that asks for a vcuda resource."""
        metadata, spec = pod["metadata"], pod["spec"]
        for container in (spec.get("initContainers") or []) + spec["containers"]:
            limits = (container.get("resources") or {}).get("limits") or {}
            for resource in RESOURCES:
                count = int(limits.get(resource, 0))
                if count:
                    self._allocate(metadata, container["name"], resource, count)

    def _allocate(self, metadata: dict[str, Any], container: str, resource: str,
                  count: int) -> None:
        with self._lock:
            taken = {d for h in self.held if h.resource == resource for d in h.ids}
            free = [d for d in self.devices.get(resource, ()) if d not in taken]
            if len(free) < count:
                raise StartError(f"UnexpectedAdmissionError: requested {count} of {resource}, "
                                 f"{len(free)} available")
            ids = self._random.sample(free, count)
            held = Held(metadata["namespace"], metadata["name"], container, resource, ids)
            self.held.append(held)
        try:
            answer = self._stubs[resource].Allocate(self._dp.AllocateRequest(
                container_requests=[self._dp.ContainerAllocateRequest(devices_ids=ids)]),
                timeout=10)
        except grpc.RpcError as exc:  # kubelet rejects the pod and holds nothing for it
            with self._lock:
                self.held.remove(held)
            raise StartError(f"UnexpectedAdmissionError: Allocate of {resource}: "
                             f"{exc.code().name} {exc.details()}") from None
        held.cdi = [d.name for d in answer.container_responses[0].cdi_devices]

    def hold(self, pod: dict[str, Any], container: str, resource: str, ids: list[str]) -> None:
        """Record ``container`` of ``pod`` as holding ``ids``, whatever they are, without
        Allocate: a kubelet gone wrong, or a caller of the plugin's socket that is not kubelet."""
        metadata = pod["metadata"]
        with self._lock:
            self.held.append(Held(metadata["namespace"], metadata["name"], container, resource,
                                  ids, [f"vcuda.io/gpu={device}" for device in ids]))

    def allocate_ids(self, resource: str, ids: list[str]) -> list[str]:
        """Allocate ``ids`` as given; return the CDI device names answered."""
        try:
            answer = self._stubs[resource].Allocate(self._dp.AllocateRequest(
                container_requests=[self._dp.ContainerAllocateRequest(devices_ids=ids)]),
                timeout=10)
        except grpc.RpcError as exc:
            raise StartError(f"Allocate of {resource}: {exc.code().name} {exc.details()}") \
                from None
        return [d.name for d in answer.container_responses[0].cdi_devices]

    def start_container(self, namespace: str, pod: str, container: str) -> list[str]:
        """PreStartContainer, then create: return the GPU UUIDs the container sees."""
        gpus: list[str] = []
        for held in self._held_by(namespace, pod, container):
            try:
                self._stubs[held.resource].PreStartContainer(
                    self._dp.PreStartContainerRequest(devices_ids=held.ids), timeout=30)
            except grpc.RpcError as exc:
                raise StartError(f"PreStartContainer of {held.resource}: {exc.details()}") \
                    from None
            gpus += self._resolve_cdi(held.cdi)
        return gpus

    def remove(self, namespace: str, pod: str) -> None:
        """The pod ended: its devices are free again."""
        with self._lock:
            self.held = [h for h in self.held if (h.namespace, h.pod) != (namespace, pod)]

    def _held_by(self, namespace: str, pod: str, container: str) -> list[Held]:
        with self._lock:
            return [h for h in self.held
                    if (h.namespace, h.pod, h.container) == (namespace, pod, container)]

    def _resolve_cdi(self, names: list[str]) -> list[str]:
        devices = {}
        for name in sorted(os.listdir(self.cdi_dir)) if os.path.isdir(self.cdi_dir) else ():
            if name.endswith(".json"):
                try:
                    devices.update(self._spec_devices(os.path.join(self.cdi_dir, name)))
                except FileNotFoundError:
                    continue  # removed since listed (a slot retired): the runtime skips it too
        gpus = []
        for name in names:
            if name not in devices:
                raise StartError(f"CreateContainerError: unresolvable CDI devices {name}")
            for mount in devices[name].get("mounts", ()):
                if mount["containerPath"].startswith(DEVICE_LIST_DIR + "/"):
                    gpus.append(mount["containerPath"][len(DEVICE_LIST_DIR) + 1:])
        return gpus


    def _spec_devices(self, path: str) -> dict[str, Any]:
        """The devices of the spec file at ``path``: read again when it changed, as a runtime's
        CDI cache refreshes on file events."""
        stat = os.stat(path)
        key = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        cached = self._specs.get(path)
        if cached is None or cached[0] != key:
            with open(path, encoding="utf-8") as source:
                spec = json.load(source)
            cached = self._specs[path] = (key, {f"{spec['kind']}={device['name']}":
                                               device["containerEdits"]
                                               for device in spec["devices"]})
        return cached[1]


class _Registration:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version}")
        self._kubelet.connect(request.resource_name, request.endpoint)
        return self._kubelet._dp.Empty()


class _Lister:
    def __init__(self, kubelet: FakeKubelet) -> None:
        self._kubelet = kubelet

    def List(self, request: Any, context: Any) -> Any:
        pr = self._kubelet._pr
        with self._kubelet._lock:
            held = list(self._kubelet.held)
        pods: dict[tuple[str, str], dict[str, list[Held]]] = {}
        for item in held:
            pods.setdefault((item.namespace, item.pod), {}).setdefault(item.container, []) \
                .append(item)
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(namespace=namespace, name=name, containers=[
                # One entry a device, as kubelet lists a plugin's devices without topology.
                pr.ContainerResources(name=container, devices=[
                    pr.ContainerDevices(resource_name=h.resource, device_ids=[device])
                    for h in items for device in h.ids])
                for container, items in containers.items()])
            for (namespace, name), containers in pods.items()])
