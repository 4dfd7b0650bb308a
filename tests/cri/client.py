"""A CRI client that drives a container runtime as kubelet does: pod sandboxes, containers,
exec, and the containers' output from their CRI log files.

Requests carry what kubelet sends for a pod on the host network: the pod's
labels and annotations, a log directory, ``runtime_handler`` from its
RuntimeClass, a cgroup parent, and per container its metadata (name and
attempt), image, command, environment and log path.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc

from runtime_hook.node.protos import load
from tests.cri.images import BUSYBOX_IMAGE

api, services = load("cri_runtime_v1", str(Path(__file__).resolve().parent))
_TIMEOUT = 60.0  # seconds a call may take: a start runs the hook, containerd may be restarting


class CriError(RuntimeError):
    """A CRI call failed; ``code`` is the gRPC status, ``details`` the runtime's message."""

    def __init__(self, method: str, error: grpc.RpcError) -> None:
        self.code = error.code()
        self.details = error.details() or ""
        super().__init__(f"{method}: {self.code.name}: {self.details}")


@dataclass
class Pod:
    """A pod sandbox this client started: its id and the config it was started with."""

    id: str
    config: object  # runtime.v1.PodSandboxConfig
    log_dir: Path


class Cri:
    """The runtime and image services on a runtime's socket."""

    def __init__(self, socket: Path, log_root: Path, cgroup_parent: str) -> None:
        self._channel = grpc.insecure_channel(f"unix://{socket}")
        self._runtime = services.RuntimeServiceStub(self._channel)
        self._images = services.ImageServiceStub(self._channel)
        self._log_root = log_root
        self._cgroup_parent = cgroup_parent

    def close(self) -> None:
        self._channel.close()

    def _call(self, service: object, method: str, request: object) -> object:
        try:
            return getattr(service, method)(request, timeout=_TIMEOUT)
        except grpc.RpcError as exc:
            raise CriError(method, exc) from None

    def version(self) -> object:
        """The runtime's name and version (``VersionResponse``)."""
        return self._call(self._runtime, "Version", api.VersionRequest(version="v1"))

    def image_id(self, name: str) -> str:
        """The id of image ``name`` in the runtime's CRI image store ('' if it is not there)."""
        answer = self._call(self._images, "ImageStatus",
                            api.ImageStatusRequest(image=api.ImageSpec(image=name)))
        return answer.image.id

    def run_pod(self, name: str, annotations: dict[str, str] | None = None,
                handler: str = "vcuda", namespace: str = "default") -> Pod:
        """Start a pod sandbox on the host network with ``annotations`` and runtime ``handler``."""
        uid = str(uuid.uuid4())
        log_dir = self._log_root / f"{namespace}_{name}_{uid}"
        log_dir.mkdir(parents=True)  # kubelet makes the pod's log directory, not the runtime
        config = api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(name=name, uid=uid, namespace=namespace),
            log_directory=str(log_dir),
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid},
            annotations=annotations or {},
            linux=api.LinuxPodSandboxConfig(
                cgroup_parent=f"{self._cgroup_parent}/pod{uid}",
                security_context=api.LinuxSandboxSecurityContext(
                    namespace_options=api.NamespaceOption(network=api.NODE, pid=api.CONTAINER)),
            ),
        )
        answer = self._call(self._runtime, "RunPodSandbox",
                            api.RunPodSandboxRequest(config=config, runtime_handler=handler))
        return Pod(answer.pod_sandbox_id, config, log_dir)

    def create(self, pod: Pod, name: str, command: list[str], env: dict[str, str] | None = None,
               mounts: dict[str, str] | None = None, attempt: int = 0,
               image: str = BUSYBOX_IMAGE, cdi_devices: list[str] | None = None,
               annotations: dict[str, str] | None = None, seccomp: bool = True) -> str:
        """Create container ``name`` (restart number ``attempt``) in ``pod``; return its id.

        ``env`` and ``mounts`` (container path -> host path, read-only) are what kubelet
        passes: the pod's and, where a device plugin allocated devices, the plugin's;
        ``cdi_devices`` the CDI devices a device plugin or a DRA driver named (kubelet 1.28
        and later), ``annotations`` extra container annotations (earlier kubelets named CDI
        devices in ``cdi.k8s.io/`` ones).
        """
        meta = pod.config.metadata
        config = api.ContainerConfig(
            metadata=api.ContainerMetadata(name=name, attempt=attempt),
            image=api.ImageSpec(image=image),
            command=command,
            envs=[api.KeyValue(key=k, value=v.encode()) for k, v in (env or {}).items()],
            mounts=[api.Mount(container_path=inside, host_path=source, readonly=True)
                    for inside, source in (mounts or {}).items()],
            labels={"io.kubernetes.container.name": name, "io.kubernetes.pod.name": meta.name,
                    "io.kubernetes.pod.namespace": meta.namespace,
                    "io.kubernetes.pod.uid": meta.uid},
            annotations={"io.kubernetes.container.restartCount": str(attempt),
                         **(annotations or {})},
            log_path=f"{name}/{attempt}.log",
            linux=api.LinuxContainerConfig(security_context=api.LinuxContainerSecurityContext(
                seccomp=api.SecurityProfile(profile_type=api.SecurityProfile.RuntimeDefault
                                            if seccomp else api.SecurityProfile.Unconfined))),
            CDI_devices=[api.CDIDevice(name=device) for device in cdi_devices or ()],
        )
        answer = self._call(self._runtime, "CreateContainer", api.CreateContainerRequest(
            pod_sandbox_id=pod.id, config=config, sandbox_config=pod.config))
        return answer.container_id

    def start(self, container: str) -> None:
        self._call(self._runtime, "StartContainer",
                   api.StartContainerRequest(container_id=container))

    def run(self, pod: Pod, name: str, command: list[str], **options: object) -> str:
        """Create and start container ``name`` in ``pod``; return its id."""
        container = self.create(pod, name, command, **options)  # type: ignore[arg-type]
        self.start(container)
        return container

    def stop(self, container: str, timeout: int = 0) -> None:
        self._call(self._runtime, "StopContainer",
                   api.StopContainerRequest(container_id=container, timeout=timeout))

    def remove(self, container: str) -> None:
        self._call(self._runtime, "RemoveContainer",
                   api.RemoveContainerRequest(container_id=container))

    def stop_pod(self, pod: Pod | str) -> None:
        pod_id = pod if isinstance(pod, str) else pod.id
        self._call(self._runtime, "StopPodSandbox",
                   api.StopPodSandboxRequest(pod_sandbox_id=pod_id))

    def remove_pod(self, pod: Pod | str) -> None:
        """Remove a pod (stopped first, as kubelet does) and its containers."""
        pod_id = pod if isinstance(pod, str) else pod.id
        self.stop_pod(pod_id)
        self._call(self._runtime, "RemovePodSandbox",
                   api.RemovePodSandboxRequest(pod_sandbox_id=pod_id))

    def pods(self) -> list[str]:
        """The ids of every pod sandbox the runtime has."""
        answer = self._call(self._runtime, "ListPodSandbox", api.ListPodSandboxRequest())
        return [item.id for item in answer.items]

    def containers(self, pod: Pod) -> dict[str, int]:
        """The containers of ``pod``: id -> ``ContainerState``."""
        answer = self._call(self._runtime, "ListContainers", api.ListContainersRequest(
            filter=api.ContainerFilter(pod_sandbox_id=pod.id)))
        return {item.id: item.state for item in answer.containers}

    def status(self, container: str) -> object:
        """The container's ``ContainerStatus``."""
        answer = self._call(self._runtime, "ContainerStatus",
                            api.ContainerStatusRequest(container_id=container))
        return answer.status

    def pid(self, container: str) -> int:
        """The host pid of the container's first process."""
        answer = self._call(self._runtime, "ContainerStatus",
                            api.ContainerStatusRequest(container_id=container, verbose=True))
        return int(json.loads(answer.info["info"])["pid"])

    def sandbox_pid(self, pod: Pod) -> int:
        """The host pid of the pod's sandbox (pause) process."""
        answer = self._call(self._runtime, "PodSandboxStatus",
                            api.PodSandboxStatusRequest(pod_sandbox_id=pod.id, verbose=True))
        return int(json.loads(answer.info["info"])["pid"])

    def exec(self, container: str, *command: str) -> object:
        """Run ``command`` in the running container (``ExecSyncResponse``: stdout, stderr,
        exit_code)."""
        return self._call(self._runtime, "ExecSync", api.ExecSyncRequest(
            container_id=container, cmd=list(command), timeout=30))

    def wait_exited(self, container: str, timeout: float = 30.0) -> object:
        """The container's status once it has exited; TimeoutError if it has not in time."""
        deadline = time.monotonic() + timeout
        while (status := self.status(container)).state != api.CONTAINER_EXITED:
            if time.monotonic() > deadline:
                raise TimeoutError(f"container {container} still runs after {timeout:g} s")
            time.sleep(0.05)
        return status

    def output(self, pod: Pod, name: str, attempt: int = 0) -> str:
        """What container ``name`` wrote to stdout and stderr, from its CRI log file."""
        text = (pod.log_dir / name / f"{attempt}.log").read_text()
        # Each line: <RFC 3339 time> <stdout|stderr> <F (full) | P (partial)> <text>
        parts = [line.split(" ", 3) for line in text.splitlines()]
        return "".join(p[3] + ("\n" if p[2] == "F" else "") for p in parts if len(p) == 4)
