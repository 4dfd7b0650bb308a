"""NVIDIA's device plugin as the test cluster's node has it (a stand-in: no GPU here).

It does what NVIDIA's k8s-device-plugin does with vcuda's ``vcuda-shared`` configuration
(manifests/device-plugin/config.yaml): it reads the GPUs from NVML (the fake
libnvidia-ml.so.1 of cshim/tests), advertises each as 100 time-sliced replicas of
``nvidia.com/gpu.shared`` (IDs ``<uuid>::<n>``), refuses a request of more than one replica
(failRequestsGreaterThanOne), and gives a container its GPU by deviceListStrategy
volume-mounts: a read-only bind mount of /dev/null at
/var/run/nvidia-container-devices/<uuid>. It registers with the real kubelet over the device
plugin API and registers again whenever kubelet made its socket anew (kubelet restarted).

    python -m tests.cluster.node.device_plugin PLUGIN_DIR
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from runtime_hook.contract import NVIDIA_SHARED_RESOURCE
from runtime_hook.device_assignment import DEVICE_LIST_DIR, DEVICE_LIST_SOURCE, ENV_NAME
from runtime_hook.node.protos import load

REPLICAS = 100
_ENDPOINT = "nvidia-gpu.sock"
_MESSAGES, _SERVICES = load("deviceplugin")


def gpu_uuids() -> list[str]:
    """The UUIDs of the GPUs NVML lists, in its order."""
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml.nvmlInit_v2() != 0:
        raise RuntimeError("NVML did not start")
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
    uuids = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
        text = ctypes.create_string_buffer(96)
        nvml.nvmlDeviceGetUUID(handle, text, len(text))
        uuids.append(text.value.decode())
    return uuids


class SharedGpus:
    """The DevicePlugin service of nvidia.com/gpu.shared."""

    def __init__(self, uuids: list[str]) -> None:
        self.ids = [f"{uuid}::{n}" for uuid in uuids for n in range(REPLICAS)]

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return _MESSAGES.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Any:
        yield _MESSAGES.ListAndWatchResponse(
            devices=[_MESSAGES.Device(ID=device, health="Healthy") for device in self.ids])
        while context.is_active():
            time.sleep(1)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "no preferred allocation")

    def Allocate(self, request: Any, context: Any) -> Any:
        answers = []
        for wanted in request.container_requests:
            ids = list(wanted.devices_ids)
            if len(ids) > 1:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"request for {NVIDIA_SHARED_RESOURCE}: {len(ids)} too large: "
                              "maximum request size for shared resources is 1")
            uuids = sorted({device.split("::")[0] for device in ids})
            answers.append(_MESSAGES.ContainerAllocateResponse(
                envs={ENV_NAME: DEVICE_LIST_DIR},
                mounts=[_MESSAGES.Mount(container_path=f"{DEVICE_LIST_DIR}/{uuid}",
                                        host_path=DEVICE_LIST_SOURCE, read_only=True)
                        for uuid in uuids]))
        return _MESSAGES.AllocateResponse(container_responses=answers)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return _MESSAGES.PreStartContainerResponse()


def _serve(plugin: SharedGpus, plugin_dir: Path) -> grpc.Server:
    socket = plugin_dir / _ENDPOINT
    socket.unlink(missing_ok=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    _SERVICES.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    with grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as channel:
        _SERVICES.RegistrationStub(channel).Register(_MESSAGES.RegisterRequest(
            version="v1beta1", endpoint=_ENDPOINT, resource_name=NVIDIA_SHARED_RESOURCE,
            options=_MESSAGES.DevicePluginOptions()), timeout=10)
    print(f"registered {NVIDIA_SHARED_RESOURCE}: {len(plugin.ids)} devices", flush=True)
    return server


def _kubelet_socket(plugin_dir: Path) -> int | None:
    try:
        return os.stat(plugin_dir / "kubelet.sock").st_ino
    except FileNotFoundError:
        return None


def main(plugin_dir: Path) -> None:
    plugin = SharedGpus(gpu_uuids())
    server: grpc.Server | None = None
    registered_with: int | None = None
    while True:
        kubelet = _kubelet_socket(plugin_dir)
        if kubelet is not None and kubelet != registered_with:
            if server is not None:
                server.stop(grace=0).wait()
            try:
                server, registered_with = _serve(plugin, plugin_dir), kubelet
            except grpc.RpcError as error:
                print(f"registration failed, trying again: {error.code().name}", flush=True)
        threading.Event().wait(1.0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
