"""vcuda installed on the test cluster as README "Install" says, with stand-ins for what needs
a GPU: ``scripts/cluster up --with-vcuda MODE`` calls these, MODE one of :data:`MODES`.

Real: vcuda's image (tests/image/build.py, podman), its manifests applied unchanged through
an overlay that only names the images, the node labels, ``vcuda-node install`` on the node's
containerd; on the placement paths vcuda's device plugin registered with the real kubelet and
the real kube-scheduler calling the extender (the ``vcuda-scheduler`` Deployment runs the
cluster's own kube-scheduler binary, in an image of that binary alone); on the DRA path the
node agent as kubelet's DRA plugin and the cluster's own kube-scheduler allocating its
ResourceSlice. Stand-ins (tests/cluster/node): NVIDIA's device plugin (the device-plugin path
only), NVIDIA's CDI spec of the GPUs (the DRA path only, :func:`nvidia_cdi_spec`), NVIDIA's
container runtime, the driver (the fake libcuda.so.1 and libnvidia-ml.so.1 of cshim/tests,
two GPUs of different memory), and systemctl (no systemd runs this node).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from runtime_hook.node.dra.slices import slice_name
from runtime_hook.node.host_root import host_path
from tests.cri.images import add_file, directories, write_layout
from tests.image import build

REPO = Path(__file__).resolve().parents[2]
DOUBLES = Path(__file__).resolve().parent / "node"
FAKE_BUILD = REPO / "cshim" / "build" / "tests"
# Each mode and the folder of manifests/ it installs (README "Install", "Or with kustomize").
MODES = {"device-plugin": "manifests", "placement": "manifests/placement",
         "placement/self-managed": "manifests/placement/self-managed", "dra": "manifests/dra"}
SELF_MANAGED_CONFIG = REPO / "manifests" / "placement" / "self-managed" / \
    "kube-scheduler-config.yaml"
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler"  # what the placement path's image names
NAMESPACE = "vcuda-system"
# Two GPUs of different memory (MiB), as the fake NVML and libcuda read them.
GPUS_MIB = (16384, 8192)
DRIVER_DIR = "/usr/local/vcuda-test-driver"  # the driver's files on the node
DRIVER_STATE = "/run/vcuda-test-driver"  # the fake GPUs' shared state, on the node
PROBE = "/usr/bin/vcuda-test-probe"  # in GPU containers: cshim/tests/probe.c
NVIDIA_RUNTIME = "/usr/local/bin/nvidia-container-runtime"
NVIDIA_CDI_SPEC = "/var/run/cdi/nvidia.yaml"  # as docs/DRA.md's `nvidia-ctk cdi generate`
_LIBRARY_DIR = "/usr/lib/x86_64-linux-gnu" if os.uname().machine == "x86_64" \
    else f"/usr/lib/{os.uname().machine}-linux-gnu"
# The node's files (of its overlays' upper layers, tests/cluster's scripts/cluster) that an
# install and an uninstall may change: all of /etc, /usr/local and /usr/sbin, and vcuda's own
# directories of /run and /var/lib (the rest of those two is kubelet's and containerd's).
NODE_FILES = ("etc", "usr/local", "usr/sbin", "run/vcuda", "var/lib/vcuda")
BEFORE_INSTALL = "node-before-vcuda.json"  # in the cluster's state directory
_FAKES = {"libcuda.so.1": f"{_LIBRARY_DIR}/libcuda.so.1",
          "libnvidia-ml.so.1": f"{_LIBRARY_DIR}/libnvidia-ml.so.1", "probe": PROBE}

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


class InstallError(RuntimeError):
    """vcuda could not be installed on the cluster; the message says why."""


def refusal(mode: str) -> str | None:
    """Why ``--with-vcuda MODE`` cannot be done today, or None."""
    if mode in MODES:
        return None
    return f"--with-vcuda {mode} is not a mode: one of {', '.join(MODES)}"


def nvidia_plugin(mode: str) -> bool:
    """Whether MODE runs NVIDIA's device plugin (its stand-in): the device-plugin path only;
    on the placement paths vcuda's own plugin hands out the GPUs, and NVIDIA's must not run."""
    return mode == "device-plugin"


def scheduler_config(mode: str, kubeconfig: Path) -> str | None:
    """The cluster's own kube-scheduler's --config for MODE: on the self-managed path the
    README's file (manifests/placement/self-managed/kube-scheduler-config.yaml) with this
    cluster's kubeconfig in place of kubeadm's; None on the other paths (no --config)."""
    if mode != "placement/self-managed":
        return None
    config = yaml.safe_load(SELF_MANAGED_CONFIG.read_text())
    config["clientConnection"]["kubeconfig"] = str(kubeconfig)
    return json.dumps(config, indent=1)


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


def node_files(node_root: Path, containerd_pid: Path, socket: Path, mode: str) -> None:
    """Put the stand-ins on the node (under the node namespace's overlays); on the DRA path
    NVIDIA's CDI spec of the GPUs too."""
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
    if mode == "dra":
        spec = Path(host_path(str(node_root), NVIDIA_CDI_SPEC))  # /var/run is /run
        spec.parent.mkdir(parents=True, exist_ok=True)
        spec.write_text(yaml.safe_dump(nvidia_cdi_spec()))


def gpu_uuid(index: int) -> str:
    """The UUID the fake driver gives GPU ``index`` (cshim/tests/fake_state.c)."""
    raw = bytes(0x10 * (index + 1) + k for k in range(16)).hex()
    return f"GPU-{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"


def nvidia_cdi_spec() -> dict:
    """NVIDIA's CDI spec as ``nvidia-ctk cdi generate --device-name-strategy=uuid`` names its
    devices (``nvidia.com/gpu=<UUID>``), for the fake driver: every GPU container gets the
    driver's files and state; each device is told to the driver by CUDA_VISIBLE_DEVICES, as
    the fake shows every GPU where NVIDIA's spec adds only the device's /dev/nvidiaN."""
    files = [{"hostPath": f"{DRIVER_DIR}/{name}", "containerPath": inside,
              "options": ["ro", "nosuid", "nodev", "bind"]} for name, inside in _FAKES.items()]
    state = {"hostPath": DRIVER_STATE, "containerPath": DRIVER_STATE,
             "options": ["rw", "nosuid", "nodev", "noexec", "bind"]}
    return {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
            "containerEdits": {"env": driver_env(), "mounts": [*files, state]},
            "devices": [{"name": gpu_uuid(index), "containerEdits": {
                "env": [f"CUDA_VISIBLE_DEVICES={gpu_uuid(index)}"]}}
                for index in range(len(GPUS_MIB))]}


def node_snapshot(upper: Path) -> dict[str, str]:
    """Each path of :data:`NODE_FILES` under the node's upper layers ``upper``, relative to
    the node's root: a file's SHA-256, a link's target, ``directory``, or ``removed`` (an
    overlay whiteout)."""
    found: dict[str, str] = {}
    for top in NODE_FILES:
        base = upper / top
        for path in [base, *sorted(base.rglob("*"))] if base.exists() else []:
            name = str(path.relative_to(upper))
            if path.is_symlink():
                found[name] = "-> " + os.readlink(path)
            elif path.is_dir():
                found[name] = "directory"
            elif path.is_file():
                found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                found[name] = "removed"
    return found


def save_node_snapshot(state: Path) -> None:
    """The node's files before vcuda is installed, for the uninstall's test to compare."""
    (state / BEFORE_INSTALL).write_text(json.dumps(node_snapshot(state / "node"), indent=1))


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


def scheduler_archive(bin_dir: Path, version: str, work: Path) -> Path:
    """The image ``registry.k8s.io/kube-scheduler:VERSION`` that the placement path's
    Deployment names, made of the cluster's own kube-scheduler binary (upstream's, as
    scripts/build-upstream built it; static, as in upstream's image), as an OCI layout tar:
    nothing is pulled."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as out:
        directories(out, ("etc", "tmp", "proc", "sys", "dev", "run", "var", "usr", "usr/local",
                          "usr/local/bin"))
        add_file(out, "usr/local/bin/kube-scheduler", (bin_dir / "kube-scheduler").read_bytes(),
                 0o755)
    return write_layout(work / "kube-scheduler.tar", {f"{SCHEDULER_IMAGE}:{version}": (
        layer.getvalue(), {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]})})


def overlay(work: Path, image: str, mode: str, version: str) -> Path:
    """The tests' overlay of MODE's folder of manifests/: the README's ``images:`` entries,
    vcuda's image and, on the placement path, kube-scheduler at the cluster's VERSION."""
    directory = work / "vcuda-overlay"
    directory.mkdir(parents=True, exist_ok=True)
    name, tag = image.rsplit(":", 1)
    images = [{"name": "registry.invalid/vcuda/vcuda", "newName": name, "newTag": tag}]
    if mode == "placement":
        images.append({"name": SCHEDULER_IMAGE, "newTag": version})
    (directory / "kustomization.yaml").write_text(json.dumps({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / MODES[mode], directory)], "images": images,
    }, indent=1))
    return directory


def apply(kubectl: Kubectl, node: str, overlay_dir: Path, mode: str) -> None:
    """README "Install" steps 3 (the device plugin's configuration; the plugin itself is the
    stand-in already running: device-plugin path only), 4 and 5; on the self-managed path the
    node is labelled a control-plane node too (it is this cluster's), where the extender's
    DaemonSet runs beside the cluster's own kube-scheduler."""
    labels = ["vcuda.io/enabled=true"]
    if nvidia_plugin(mode):
        _ok(kubectl, "create", "namespace", "nvidia-device-plugin")
        _ok(kubectl, "apply", "-n", "nvidia-device-plugin", "-f",
            str(REPO / "manifests" / "device-plugin" / "config.yaml"))
        labels.append("nvidia.com/device-plugin.config=vcuda-shared")
    if mode == "placement/self-managed":
        labels.append("node-role.kubernetes.io/control-plane=")
    _ok(kubectl, "apply", "-k", str(overlay_dir))
    _ok(kubectl, "label", "node", node, *labels)


def _workloads(mode: str) -> tuple[str, ...]:
    placement = {"placement": ("deployment/vcuda-scheduler",),
                 "placement/self-managed": ("daemonset/vcuda-scheduler-extender",)}
    return ("deployment/vcuda-webhook", "daemonset/vcuda-node", *placement.get(mode, ()))


def wait_ready(kubectl: Kubectl, mode: str, node: str, timeout: float = 600) -> None:
    """Until every Deployment and DaemonSet of MODE rolled out (the webhook's pods wait for
    the Secret of the certificate Job), the Job set the webhook configuration's caBundle, and
    the apiserver reaches the webhook; on the placement paths also until kubelet advertises
    vcuda's device plugins' slots for both GPUs and every extender has listed the nodes; on
    the DRA path until the node agent's ResourceSlice offers both GPUs."""
    deadline = time.monotonic() + timeout
    for workload in _workloads(mode):
        left = max(int(deadline - time.monotonic()), 1)
        _ok(kubectl, "-n", NAMESPACE, "rollout", "status", workload, f"--timeout={left}s")
    left = max(int(deadline - time.monotonic()), 1)
    _ok(kubectl, "wait", "mutatingwebhookconfiguration/vcuda-webhook", f"--timeout={left}s",
        "--for=jsonpath={.webhooks[0].clientConfig.caBundle}")
    _wait_for_admission(kubectl, deadline)
    if mode in ("placement", "placement/self-managed"):
        wait_placement_ready(kubectl, node, deadline)
    if mode == "dra":
        wait_slice_published(kubectl, node, deadline)


def wait_slice_published(kubectl: Kubectl, node: str, deadline: float) -> None:
    """Until the apiserver holds the node agent's ResourceSlice of ``node`` with a device for
    each GPU."""
    devices = "jsonpath={.spec.devices[*].name}"
    _until(lambda: len(kubectl("get", "resourceslice", slice_name(node), "-o", devices)
                       .stdout.split()) == len(GPUS_MIB), deadline,
           f"the node agent does not publish the ResourceSlice of {node}'s GPUs")


def wait_placement_ready(kubectl: Kubectl, node: str, deadline: float) -> None:
    """Until kubelet advertises vcuda's slots of both GPUs (its device plugins registered:
    100 shares and one whole GPU each) and each extender answers /readyz (it listed the
    nodes); also after a restart of kubelet, the node agent or an extender."""
    allocatable = "jsonpath={.status.allocatable.vcuda\\.io/shared-gpu} " \
                  "{.status.allocatable.vcuda\\.io/gpu}"
    _until(lambda: kubectl("get", "node", node, "-o", allocatable).stdout
           == f"{100 * len(GPUS_MIB)} {len(GPUS_MIB)}", deadline,
           f"kubelet does not advertise vcuda.io/shared-gpu and vcuda.io/gpu of {node}")
    selector = "app.kubernetes.io/name in (vcuda-scheduler, vcuda-scheduler-extender)"
    listed = json.loads(_ok(kubectl, "get", "pods", "-n", NAMESPACE, "-l", selector, "-o",
                            "json"))["items"]
    # not those on their way out (a rollout's old pods), which never answer again
    pods = [pod["metadata"]["name"] for pod in listed
            if not pod["metadata"].get("deletionTimestamp")]
    for pod in pods:
        _until(functools.partial(_extender_ready, kubectl, pod), deadline,
               f"the extender of {pod} does not answer /readyz")


def _extender_ready(kubectl: Kubectl, pod: str) -> bool:
    probe = ("import urllib.request; "
             "urllib.request.urlopen('http://127.0.0.1:8888/readyz', timeout=5)")
    return kubectl("exec", "-n", NAMESPACE, pod, "-c", "extender", "--", "python", "-c",
                   probe).returncode == 0


def _until(ready: Callable[[], bool], deadline: float, failure: str) -> None:
    while not ready():
        if time.monotonic() > deadline:
            raise InstallError(failure)
        time.sleep(1)


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

