"""vcuda installed on the test cluster as README "Install" says, with stand-ins for what needs
a GPU: ``scripts/cluster up --with-vcuda device-plugin`` calls these.

Real: vcuda's image (tests/image/build.py, podman), its manifests applied unchanged through
an overlay that only names the image, the node labels, ``vcuda-node install`` on the node's
containerd. Stand-ins
(tests/cluster/node): NVIDIA's device plugin, NVIDIA's container runtime, the driver (the
fake libcuda.so.1 and libnvidia-ml.so.1 of cshim/tests, two GPUs of different memory), and
systemctl (no systemd runs this node).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.image import build

REPO = Path(__file__).resolve().parents[2]
DOUBLES = Path(__file__).resolve().parent / "node"
FAKE_BUILD = REPO / "cshim" / "build" / "tests"
MODES = ("device-plugin",)
NAMESPACE = "vcuda-system"
# Two GPUs of different memory (MiB), as the fake NVML and libcuda read them.
GPUS_MIB = (16384, 8192)
DRIVER_DIR = "/usr/local/vcuda-test-driver"  # the driver's files on the node
DRIVER_STATE = "/run/vcuda-test-driver"  # the fake GPUs' shared state, on the node
PROBE = "/usr/bin/vcuda-test-probe"  # in GPU containers: cshim/tests/probe.c
NVIDIA_RUNTIME = "/usr/local/bin/nvidia-container-runtime"
_LIBRARY_DIR = "/usr/lib/x86_64-linux-gnu" if os.uname().machine == "x86_64" \
    else f"/usr/lib/{os.uname().machine}-linux-gnu"
_FAKES = {"libcuda.so.1": f"{_LIBRARY_DIR}/libcuda.so.1",
          "libnvidia-ml.so.1": f"{_LIBRARY_DIR}/libnvidia-ml.so.1", "probe": PROBE}

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


class InstallError(RuntimeError):
    """vcuda could not be installed on the cluster; the message says why."""


def refusal(mode: str) -> str | None:
    """Why ``--with-vcuda MODE`` cannot be done today, or None."""
    if mode in MODES:
        return None
    return (f"--with-vcuda {mode} is not supported yet: only {', '.join(MODES)} "
            "(placement and DRA come with their own stand-ins)")


def driver_env() -> list[str]:
    """The environment the fake driver reads: its GPUs and their shared state."""
    return [f"VCUDA_FAKE_GPUS={','.join(map(str, GPUS_MIB))}",
            f"VCUDA_FAKE_STATE={DRIVER_STATE}/state"]


def build_image() -> str:
    """vcuda's image, built once per content of its inputs; the fake driver, built."""
    subprocess.run(["make", "-s", "-C", str(REPO / "cshim"), "tests",
                    f"PYTHON={REPO / '.venv' / 'bin' / 'python'}"], check=True, timeout=600)
    try:
        return build.cached()
    except build.BuildError as error:
        raise InstallError(str(error)) from None


def node_files(node_root: Path, containerd_pid: Path, socket: Path) -> None:
    """Put the stand-ins on the node (under the node namespace's overlays)."""
    driver = node_root / DRIVER_DIR.lstrip("/")
    driver.mkdir(parents=True, exist_ok=True)
    for name in _FAKES:
        shutil.copy(FAKE_BUILD / name, driver / name)
    (driver / "driver.json").write_text(json.dumps({
        "files": {inside: f"{DRIVER_DIR}/{name}" for name, inside in _FAKES.items()},
        "state_dir": DRIVER_STATE, "env": driver_env()}, indent=1))
    state = node_root / DRIVER_STATE.lstrip("/")
    state.mkdir(parents=True, exist_ok=True)
    # Open to every user, as a driver's /dev/nvidia* files are: a container's user opens it.
    (state / "state").touch(mode=0o666)
    (state / "state").chmod(0o666)
    runtime = node_root / NVIDIA_RUNTIME.lstrip("/")
    runtime.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(DOUBLES / "nvidia-container-runtime", runtime)
    systemctl = node_root / "usr/sbin/systemctl"
    systemctl.write_text((DOUBLES / "systemctl").read_text()
                         .replace("@PID_FILE@", str(containerd_pid))
                         .replace("@SOCKET@", str(socket)))
    systemctl.chmod(0o755)


def containerd_default_runtime() -> str:
    """The containerd configuration that makes NVIDIA's runtime the default one, as the GPU
    Operator and NVIDIA's toolkit set a GPU node up."""
    return ('\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
            f'  BinaryName = "{NVIDIA_RUNTIME}"\n')


def device_plugin_command(python: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment of the device plugin stand-in (run on the node)."""
    env = dict(item.split("=", 1) for item in driver_env())
    env.update(LD_LIBRARY_PATH=DRIVER_DIR, PYTHONPATH=str(REPO))
    return ([str(python), "-m", "tests.cluster.node.device_plugin",
             "/var/lib/kubelet/device-plugins"], env)


def save(tag: str, work: Path) -> Path:
    archive = work / (tag.rsplit("/", 1)[1].replace(":", "-") + ".tar")
    archive.unlink(missing_ok=True)
    subprocess.run(["podman", "save", "--format", "docker-archive", "-o", str(archive), tag],
                   check=True, capture_output=True, timeout=600)
    return archive


def import_images(ctr: Path, socket: Path, archives: list[Path]) -> None:
    """Images into the cluster containerd's k8s.io namespace, as kubelet's CRI sees them."""
    for archive in archives:
        subprocess.run([str(ctr), "--address", str(socket), "-n", "k8s.io", "images", "import",
                        str(archive)], check=True, capture_output=True, timeout=600)
        archive.unlink()


def overlay(work: Path, image: str) -> Path:
    """The tests' overlay of manifests/ (the device-plugin path): the README's ``images:``
    entry for vcuda's image."""
    directory = work / "vcuda-overlay"
    directory.mkdir(parents=True, exist_ok=True)
    name, tag = image.rsplit(":", 1)
    (directory / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "manifests", directory)],
        "images": [{"name": "registry.invalid/vcuda/vcuda", "newName": name, "newTag": tag}],
    }, indent=1))
    return directory


def apply(kubectl: Kubectl, node: str, overlay_dir: Path) -> None:
    """README "Install" steps 3 (the device plugin's configuration; the plugin itself is the
    stand-in already running), 4 and 5."""
    _ok(kubectl, "create", "namespace", "nvidia-device-plugin")
    _ok(kubectl, "apply", "-n", "nvidia-device-plugin", "-f",
        str(REPO / "manifests" / "device-plugin" / "config.yaml"))
    _ok(kubectl, "apply", "-k", str(overlay_dir))
    _ok(kubectl, "label", "node", node, "nvidia.com/device-plugin.config=vcuda-shared",
        "vcuda.io/enabled=true")


def wait_ready(kubectl: Kubectl, timeout: float = 600) -> None:
    """Until every Deployment and DaemonSet of the device-plugin path rolled out (the
    webhook's pods wait for the Secret of the certificate Job) and the Job set the webhook
    configuration's caBundle."""
    deadline = time.monotonic() + timeout
    for workload in ("deployment/vcuda-webhook", "daemonset/vcuda-node"):
        left = max(int(deadline - time.monotonic()), 1)
        _ok(kubectl, "-n", NAMESPACE, "rollout", "status", workload, f"--timeout={left}s")
    left = max(int(deadline - time.monotonic()), 1)
    _ok(kubectl, "wait", "mutatingwebhookconfiguration/vcuda-webhook", f"--timeout={left}s",
        "--for=jsonpath={.webhooks[0].clientConfig.caBundle}")
    _wait_for_admission(kubectl, deadline)


def _wait_for_admission(kubectl: Kubectl, deadline: float) -> None:
    """Until the apiserver reaches the webhook through its Service: pods can be Ready a moment
    before kube-proxy routes the Service's address to them (seen: connection refused)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as pod:
        json.dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vcuda-probe"},
                   "spec": {"containers": [{"name": "main", "image": "probe", "resources": {
                       "limits": {"docker.com/vcuda-core": "10",
                                  "docker.com/vcuda-memory": "1"}}}]}}, pod)
        pod.flush()
        while True:
            result = kubectl("create", "--dry-run=server", "-f", pod.name)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise InstallError(f"the webhook is not reached through its Service: "
                                   f"{result.stderr.strip()}")
            time.sleep(1)


def _ok(kubectl: Kubectl, *args: str) -> str:
    result = kubectl(*args)
    if result.returncode != 0:
        raise InstallError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout

