"""OCI bundles with a busybox-static root run by a real runtime, for hook tests and benchmark."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from demo.node import NO_USER_NAMESPACES
from runtime_hook.device_assignment import device_plugin_spec
from tests.busybox_root import make_busybox_root

REPO = Path(__file__).resolve().parents[2]
HOOK_SCRIPT = REPO / "runtime_hook" / "oci_hook.py"
# The hook runs on nodes with the system Python and nothing installed: use that Python here too.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
HOOK_ENV = ("PATH=/usr/sbin:/usr/bin:/sbin:/bin",)
APPLETS = (
    *("sh", "cat", "ls", "echo", "touch", "sleep", "true", "stat", "awk", "sha256sum"),
    *("mv", "rm", "rmdir", "umount", "unshare", "mount"),
)
# What containerd gives a container's process that asks for none (its default set).
CONTAINERD_CAPABILITIES = tuple(f"CAP_{name}" for name in (
    "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
    "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"))


def make_rootfs(path: Path) -> Path:
    """Create a minimal root at ``path``: busybox-static and the applets the tests call."""
    return make_busybox_root(path, APPLETS)


def runc_spec(scratch: Path) -> dict:
    """The default spec that ``runc spec`` writes, as a dict."""
    scratch.mkdir(parents=True, exist_ok=True)
    subprocess.run(["runc", "spec", "--bundle", str(scratch)], check=True)
    return json.loads((scratch / "config.json").read_text())


@dataclass(frozen=True)
class HookSetup:
    """Where the hook under test keeps its state and finds its files on the host."""

    state_dir: Path
    library: Path
    inventory: Path
    log_file: Path
    log_level: str = "debug"  # tests read every line; nodes run at the default, info
    flags: tuple[str, ...] = ()  # more of the hook's flags (the node's sharing settings)

    def args(self, stage: str, python_flags: tuple[str, ...] = ("-I", "-S")) -> list[str]:
        """The hook's argv for ``stage``: the in-tree file run by the system Python."""
        return [
            PYTHON,
            *python_flags,
            str(HOOK_SCRIPT),
            stage,
            "--state-dir",
            str(self.state_dir),
            "--library",
            str(self.library),
            "--inventory",
            str(self.inventory),
            "--log-file",
            str(self.log_file),
            "--log-level",
            self.log_level,
            *self.flags,
        ]

    def hooks(self, env: tuple[str, ...] = HOOK_ENV) -> dict:
        """The config.json ``hooks`` object running the hook at prestart and poststop."""
        return {
            stage: [{"path": PYTHON, "args": self.args(stage), "env": list(env), "timeout": 20}]
            for stage in ("prestart", "poststop")
        }


def limits_annotation(**containers: tuple[int, int]) -> dict[str, str]:
    """``vcuda.io/limits`` for containers given as name=(cores, memory bytes)."""
    table = {name: {"cores": c, "memory": m} for name, (c, m) in containers.items()}
    return {"vcuda.io/limits": json.dumps(table)}


def write_bundle(
    bundle: Path,
    spec: dict,
    args: list[str],
    *,
    name: str = "main",
    annotations: dict[str, str] | None = None,
    env: tuple[str, ...] = (),
    gpus: tuple[str, ...] = (),
    hooks: dict | None = None,
    readonly: bool = False,
    uid: int = 0,
    seccomp: dict | None = NO_USER_NAMESPACES,
    capabilities: tuple[str, ...] = (),
) -> Path:
    """Write ``bundle/config.json`` from ``spec``; the root must be at ``bundle/rootfs``.

    The process gets ``seccomp`` (None: no filter) and, besides the spec's own, the
    ``capabilities`` named.

    ``gpus`` are given as NVIDIA's device plugin gives them (volume mounts and
    its variable), before the container's own ``env``, as kubelet orders them.
    """
    config = json.loads(json.dumps(spec))
    config["process"].update(terminal=False, args=args, user={"uid": uid, "gid": uid})
    plugin_env, plugin_mounts = device_plugin_spec(gpus)
    config["process"]["env"] = [*config["process"]["env"], *plugin_env, *env]
    config["mounts"] = [*config["mounts"], *plugin_mounts]
    config["root"] = {"path": "rootfs", "readonly": readonly}
    if seccomp is not None:
        config["linux"]["seccomp"] = seccomp
    for kind in config["process"]["capabilities"].values():
        kind.extend(capabilities)
    if annotations is not None:
        config["annotations"] = {"io.kubernetes.cri.container-name": name, **annotations}
    if hooks is not None:
        config["hooks"] = hooks
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


@dataclass(frozen=True)
class Runtime:
    """A real OCI runtime binary with its own state root."""

    name: str
    root: Path
    wrapper: tuple[str, ...] = ()

    def command(self, *args: str) -> list[str]:
        return [*self.wrapper, self.name, "--root", str(self.root), *args]

    def run(self, bundle: Path, cid: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``<runtime> run`` in the foreground; output captured."""
        return subprocess.run(
            self.command("run", "--bundle", str(bundle), cid),
            cwd=bundle,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run_detached(self, bundle: Path, cid: str, log: Path) -> subprocess.CompletedProcess:
        """``<runtime> run -d``; the container keeps runc's stdio, so it goes to ``log``."""
        with open(log, "w") as out:
            return subprocess.run(
                self.command("run", "-d", "--bundle", str(bundle), cid),
                cwd=bundle,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                timeout=60,
                check=False,
            )

    def call(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=60, check=False
        )


def snapshot(path: Path) -> dict[str, tuple]:
    """Everything about a tree that a write could change: types, modes, times, contents, links."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for entry in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            st = os.lstat(entry)
            if stat.S_ISLNK(st.st_mode):
                body: object = os.readlink(entry)
            elif stat.S_ISREG(st.st_mode):
                body = Path(entry).read_bytes()
            else:
                body = None
            found[os.path.relpath(entry, path)] = (st.st_mode, st.st_uid, st.st_mtime_ns, body)
    return found


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this (the host's) mount namespace."""
    prefix = str(path)
    with open("/proc/self/mountinfo") as src:
        points = [line.split()[4] for line in src]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]
