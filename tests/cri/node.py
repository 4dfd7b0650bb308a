"""A Kubernetes node without kubelet: real containerd, set up by ``vcuda-node install``, in a
private mount namespace of its own, driven over CRI.

The node's paths are the real ones (``/etc/containerd/config.toml``,
``/etc/vcuda``, ``/usr/local/vcuda``, ``/run/vcuda``): ``/etc``, ``/usr/local``,
``/usr/bin`` and ``/run`` are overlays in the namespace whose upper layers are
under the work directory, so install and containerd write there and this
machine's own files are never touched. containerd, its shims, runc and the
hook all run in that namespace; its root, state and socket are under the
work directory. The test reaches the node's files through
``/proc/<pid>/root`` of the process that holds the namespace.

Each containerd release found here is a node of its own (:func:`releases`):
the system's (1.6 on Debian 12) and those ``scripts/fetch-containerd``
unpacked under ``build/containerd`` (1.7 from Debian 13, 2.x from Debian
unstable), each run from its own directory with its own shim and ``ctr``, and
given the configuration version it reads (2 for 1.x, 3 for 2.x) with CDI on
where it has it (1.7 and later), as an operator of such a node would.

The ``vcuda`` handler's ``BinaryName`` is NVIDIA's runtime, which a CI
machine does not have: on this node ``/usr/bin/nvidia-container-runtime`` is
a link to runc, i.e. an NVIDIA runtime with nothing to inject. Everything
else of the handler is as install wrote it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from runtime_hook.contract import INVENTORY_NAME, Gpu, write_inventory
from tests.cri.client import Cri, CriError
from tests.cri.images import write_images

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "cshim" / "build" / "libvcuda.so"
STATE_DIR = "/run/vcuda"
_OVERLAID = ("etc", "usr/local", "usr/bin", "run")
UNPACKED = REPO / "build" / "containerd"  # where scripts/fetch-containerd puts releases
SANDBOX_IMAGE = "localhost/vcuda-test/pause:1"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
TRANSIENT_CDI_DIR = "/run/cdi"  # /var/run/cdi, without the link: see ContainerdNode.path
_TOOLS = ("runc", "unshare", "nsenter")
_RELEASE_TOOLS = ("containerd", "containerd-shim-runc-v2", "ctr")
_NVIDIA_RUNTIME = "/usr/bin/nvidia-container-runtime"


@dataclass(frozen=True)
class Release:
    """A containerd release the tests run: its version and the directory of its binaries."""

    version: str
    bin_dir: Path

    @property
    def major_minor(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    @property
    def config_version(self) -> int:
        """The configuration version this release reads natively (3 from 2.0 on)."""
        return 3 if self.major_minor >= (2, 0) else 2

    @property
    def has_cdi(self) -> bool:
        """Whether its CRI plugin applies CDI devices (1.7 and later)."""
        return self.major_minor >= (1, 7)

    def tool(self, name: str) -> str:
        return str(self.bin_dir / name)


def _release(bin_dir: Path) -> Release | None:
    """The release whose binaries are in ``bin_dir``, or None if it has not all of them."""
    if not all((bin_dir / tool).is_file() for tool in _RELEASE_TOOLS):
        return None
    said = subprocess.run([str(bin_dir / "containerd"), "--version"], capture_output=True,
                          text=True, timeout=30, check=True).stdout.split()
    # "containerd github.com/containerd/containerd[/v2] 1.6.20~ds1 [revision]": 1.6.20
    return Release(re.split(r"[~+-]", said[2].removeprefix("v"))[0], bin_dir)


def releases() -> list[Release]:
    """The system's containerd and those unpacked under ``build/containerd``, oldest first,
    one of each version."""
    system = shutil.which("containerd")
    found = [_release(Path(system).parent)] if system else []
    found += [_release(d / "usr" / "bin") for d in sorted(UNPACKED.glob("*"))]
    by_version = {r.version: r for r in reversed(found) if r is not None}  # the system's first
    return sorted(by_version.values(), key=lambda r: r.major_minor)


def missing() -> str | None:
    """Why this machine cannot hold a test node, or None if it can."""
    if os.geteuid() != 0:
        return "a containerd node needs root"
    absent = [tool for tool in _TOOLS if not shutil.which(tool)]
    if absent:
        return f"a containerd node needs {', '.join(absent)} (scripts/setup installs them)"
    if not LIBRARY.is_file():
        return f"libvcuda.so is not built at {LIBRARY} (make -C cshim)"
    return None


def cri_plugins(config_version: int) -> tuple[str, str]:
    """The sections of the CRI plugin's runtime and image settings in a configuration of
    ``config_version``."""
    if config_version == 3:
        return "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"
    return "io.containerd.grpc.v1.cri", "io.containerd.grpc.v1.cri"


def containerd_config(work: Path, release: Release) -> str:
    """The node's ``/etc/containerd/config.toml`` before install: the release's own
    configuration version, private paths, CDI on where the release has it."""
    runtime, images = cri_plugins(release.config_version)
    # No lower oom_score_adj than containerd's: machines that run tests may forbid lowering it.
    settings = ["restrict_oom_score_adj = true"]
    if release.config_version == 3:
        pinned = f'\n[plugins."{images}".pinned_images]\n  sandbox = "{SANDBOX_IMAGE}"\n'
    else:
        pinned = ""
        settings.append(f'sandbox_image = "{SANDBOX_IMAGE}"')
    if release.has_cdi:
        settings += ["enable_cdi = true", f"cdi_spec_dirs = {json.dumps(list(CDI_DIRS))}"]
    lines = "".join(f"  {line}\n" for line in settings)
    return f"""version = {release.config_version}
root = "{work}/containerd/root"
state = "{work}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{work}/containerd.sock"
{pinned}
[plugins."{runtime}"]
{lines}  [plugins."{runtime}".cni]
    conf_dir = "{work}/cni"
"""


class ContainerdNode:
    """The node: its namespace, containerd, a CRI client (``cri``) and the hook's state."""

    def __init__(self, work: Path, release: Release) -> None:
        self.work = work
        self.release = release
        self.socket = work / "containerd.sock"
        self.log = work / "containerd.log"
        self.cgroup = f"/vcuda-cri-{os.getpid()}"
        self.cri = Cri(self.socket, work / "pods", self.cgroup)
        self._holder: subprocess.Popen | None = None
        self._containerd: subprocess.Popen | None = None

    # --- the node's files -------------------------------------------------------------------

    def path(self, node_path: str) -> Path:
        """A path of the node as its processes see it. Links in it resolve outside the node
        (``/var/run`` to this machine's ``/run``): name the link's target."""
        assert self._holder is not None
        return Path(f"/proc/{self._holder.pid}/root") / node_path.lstrip("/")

    def write_inventory(self, gpus: list[Gpu]) -> None:
        """Make ``gpus`` the hook's GPU inventory, as the node agent would."""
        state = self.path(STATE_DIR)
        state.mkdir(mode=0o755, exist_ok=True)
        write_inventory(str(state / INVENTORY_NAME), gpus)

    def ledger(self) -> list[str]:
        """The ids of the containers the hook's ledger holds memory for."""
        records = self.path(STATE_DIR) / "containers"
        return sorted(p.name for p in records.iterdir()) if records.is_dir() else []

    def oci_spec(self, container: str) -> dict:
        """The OCI spec containerd gave ``container`` (its bundle's ``config.json``)."""
        bundle = self.work / "containerd/state/io.containerd.runtime.v2.task/k8s.io" / container
        return json.loads((bundle / "config.json").read_text())

    def hook_log(self) -> str:
        log = self.path(STATE_DIR) / "hook.log"
        return log.read_text() if log.exists() else ""

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Make the namespace, install vcuda, start containerd, import the images."""
        upper = self.work / "node"
        for directory in _OVERLAID:
            (upper / directory).mkdir(parents=True)
            (self.work / "overlay-work" / directory).mkdir(parents=True)
        (self.work / "cni").mkdir()
        for cdi_dir in CDI_DIRS:  # as a node has them, so that containerd watches them
            (upper / cdi_dir.lstrip("/").replace("var/run/", "run/")).mkdir(parents=True)
        (upper / _NVIDIA_RUNTIME.lstrip("/")).symlink_to(shutil.which("runc"))
        config = upper / "etc/containerd/config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(containerd_config(self.work, self.release))
        mounts = "; ".join(
            f"mount -t overlay overlay -o lowerdir=/{d},upperdir={upper / d},"
            f"workdir={self.work / 'overlay-work' / d} /{d}"
            for d in _OVERLAID
        )
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
             f"{mounts}; echo ready; exec sleep infinity"],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        if self._holder.stdout.readline().strip() != "ready":
            raise RuntimeError("could not make the node's mount namespace (overlays)")
        result = self.install()
        if result.returncode != 0:
            raise RuntimeError(f"vcuda-node install failed:\n{result.stderr}")
        self.start_containerd()
        images = write_images(self.work / "images.tar")
        subprocess.run([self.release.tool("ctr"), "--address", str(self.socket), "-n", "k8s.io",
                        "images", "import", str(images)], check=True, capture_output=True,
                       timeout=120)

    def install(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``vcuda-node install`` on the node, with this checkout's libvcuda.so."""
        return self.in_node(
            sys.executable, "-m", "runtime_hook.node", "install", "--runtime", "containerd",
            "--library", str(LIBRARY), "--no-restart-runtime", *args,
        )

    def in_node(self, *command: str) -> subprocess.CompletedProcess[str]:
        """Run ``command`` in the node's mount namespace; output captured."""
        assert self._holder is not None
        return subprocess.run(["nsenter", "--target", str(self._holder.pid), "--mount", "--",
                               *command], cwd=REPO, capture_output=True, text=True, timeout=120,
                              check=False)

    def start_containerd(self) -> None:
        """Start containerd on the node and wait until its CRI service answers."""
        assert self._holder is not None
        with open(self.log, "a") as log:
            self._containerd = subprocess.Popen(
                ["nsenter", "--target", str(self._holder.pid), "--mount", "--",
                 self.release.tool("containerd"), "--config", "/etc/containerd/config.toml"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                # Its own shim first: containerd looks for it on PATH.
                env={**os.environ, "PATH": f"{self.release.bin_dir}:{os.environ['PATH']}"},
            )
        deadline = time.monotonic() + 30
        while True:
            if self._containerd.poll() is not None:
                raise RuntimeError(f"containerd exited with {self._containerd.returncode}:\n"
                                   f"{self.log.read_text()[-4000:]}")
            with contextlib.suppress(CriError):
                if self.socket.exists() and self.cri.version():
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd's CRI did not answer in 30 s:\n"
                                   f"{self.log.read_text()[-4000:]}")
            time.sleep(0.05)

    def ensure_containerd(self) -> None:
        """Start containerd if it is not running (a test may have stopped it)."""
        if self._containerd is None or self._containerd.poll() is not None:
            self.start_containerd()

    def stop_containerd(self) -> None:
        """Stop containerd as systemd does (SIGTERM); its shims and containers keep running."""
        if self._containerd is not None and self._containerd.poll() is None:
            self._containerd.terminate()
            try:
                self._containerd.wait(20)
            except subprocess.TimeoutExpired:
                self._containerd.kill()
                self._containerd.wait()
        self._containerd = None

    def close(self) -> None:
        """Remove every pod, stop containerd, end what is left in the namespace, and clean up."""
        try:
            if self._containerd is not None:
                with contextlib.suppress(CriError):  # a containerd without CRI: the kills below
                    for pod in self.cri.pods():
                        self.cri.remove_pod(pod)
        finally:
            self.cri.close()
            self.stop_containerd()
            self._end_leftovers()
            if self._holder is not None:
                self._holder.kill()
                self._holder.wait()
            shutil.rmtree(self.work, ignore_errors=True)

    def _end_leftovers(self) -> None:
        """Kill what this node started and that outlived it: shims in its namespace, and the
        processes of its pods' cgroups; then remove those cgroups."""
        if self._holder is None:
            return
        mine = os.readlink(f"/proc/{self._holder.pid}/ns/mnt")
        pids = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != self._holder.pid:
                with contextlib.suppress(OSError):
                    if os.readlink(entry / "ns/mnt") == mine:
                        pids.add(int(entry.name))
        name = self.cgroup.lstrip("/")  # under each v1 hierarchy, or the v2 root
        found = [*Path("/sys/fs/cgroup").glob(f"{name}/**/"),
                 *Path("/sys/fs/cgroup").glob(f"*/{name}/**/")]
        groups = sorted(found, key=lambda p: len(p.parts), reverse=True)
        for group in groups:
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (group / "cgroup.procs").read_text().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1 if pids else 0)
        for group in groups:
            with contextlib.suppress(OSError):
                group.rmdir()
