"""The demo's node side: each admitted container as an OCI bundle, started by real runc.

The bundle is what containerd would hand its runtime: the node's base spec
(``manifests/node/base-runtime-spec.json``) with the hook at prestart and
poststop for pods of runtime class ``vcuda``, the CRI annotations, and the
pod's ``vcuda.io/*`` annotations. Only the node paths are moved into the
demo's work directory.
"""

from __future__ import annotations

import fnmatch
import json
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

from demo.commands import REPO
from runtime_hook.confinement import CLONE_NEWUSER
from runtime_hook.contract import (
    ACCOUNT_PATH,
    ANNOTATION_DOMAIN,
    INVENTORY_NAME,
    LIMITS_PATH,
    Gpu,
    Limits,
    LimitsFormatError,
    parse_limits,
    write_inventory,
)
from runtime_hook.device_assignment import device_plugin_spec
from tests.busybox_root import make_busybox_root

BASE_SPEC = REPO / "manifests" / "node" / "base-runtime-spec.json"
BUILT_LIBRARY = REPO / "cshim" / "build" / "libvcuda.so"
RUNTIME_CLASS = "vcuda"
# The vcuda handler's pod_annotations (manifests/node/containerd-*.toml).
POD_ANNOTATIONS = (f"{ANNOTATION_DOMAIN}/*",)
# Where the node DaemonSet installs the hook's files (docs/NODE-HOOK.md).
_NODE_HOOK = "/usr/local/vcuda/python/runtime_hook/oci_hook.py"
_NODE_STATE = "/run/vcuda"
NODE_LIBRARY = "/usr/local/vcuda/lib/libvcuda.so"
_DEVICE_RESOURCES = ("nvidia.com/gpu.shared", "nvidia.com/gpu")
# Prints the two files the hook provides, then tries to raise its own limits.
_PROBE = """
show() { echo "== $1"; if [ -e "$1" ]; then cat "$1"; else echo "(absent)"; fi; }
show /etc/ld.so.preload
show /etc/vcuda/limits
if [ -e /etc/vcuda/limits ]; then
    echo "== raise"
    { echo cores=100 >> /etc/vcuda/limits && echo "(written)"; } 2>&1
fi
exit 0
"""
_HOOK_LINE = re.compile(r"(vcuda-hook: .*?)(?:\\n|\"|$)", re.MULTILINE)


class Node(NamedTuple):
    """The host files the hook works with, in the demo's work directory."""

    state_dir: Path
    library: Path
    gpus: tuple[Gpu, ...]


def prepare_node(work: Path, gpus: tuple[Gpu, ...]) -> Node:
    """Make the hook's state dir with ``gpus`` as its inventory, and find the library.

    The library is this checkout's ``cshim`` build when there is one, else a
    placeholder file: the hook only bind-mounts it, and busybox is static.
    """
    state = work / "state"
    state.mkdir(mode=0o755)
    write_inventory(str(state / INVENTORY_NAME), list(gpus))
    library = BUILT_LIBRARY
    if not library.is_file():
        library = work / "libvcuda.so"
        library.write_text("placeholder for libvcuda.so: build it with make -C cshim\n")
    return Node(state, library, gpus)


def node_hooks(node: Node) -> dict[str, list[dict[str, Any]]]:
    """The base spec's hooks, as the manifests wire them, with node paths moved to the demo's."""
    moved = {_NODE_HOOK: str(REPO / "runtime_hook" / "oci_hook.py"),
             _NODE_STATE: str(node.state_dir), NODE_LIBRARY: str(node.library)}
    hooks = _base_spec()["hooks"]
    for entries in hooks.values():
        for hook in entries:
            hook["args"] = [moved.get(arg, arg) for arg in hook["args"]]
    return hooks


def device_count(container: dict[str, Any]) -> int:
    """The GPUs the device plugin gives the admitted container."""
    limits = container.get("resources", {}).get("limits", {})
    return sum(int(limits.get(resource, 0)) for resource in _DEVICE_RESOURCES)


# What the demo gives a container of seccompProfile RuntimeDefault, standing in for
# containerd's own default profile: a filter, in the runtime spec's form, that refuses
# creating and joining user namespaces, as a limited container must have (containerd's is an
# allow-list of several hundred calls; tests/cri runs that one).
NO_USER_NAMESPACES = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [
        {"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
        # ENOSYS, as RuntimeDefault answers: glibc then falls back to clone.
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
        {"names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
         "args": [{"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER,
                   "op": "SCMP_CMP_MASKED_EQ"}]},
    ],
}


def container_config(pod: dict[str, Any], container: dict[str, Any], node: Node,
                     devices: tuple[str, ...]) -> dict[str, Any]:
    """The config.json containerd would write for ``container`` of the admitted ``pod``."""
    metadata = pod["metadata"]
    config = _base_spec()
    annotations = {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": container["name"],
        "io.kubernetes.cri.sandbox-name": metadata["name"],
        "io.kubernetes.cri.sandbox-namespace": metadata["namespace"],
    }
    if pod["spec"].get("runtimeClassName") == RUNTIME_CLASS:
        config["hooks"] = node_hooks(node)
        annotations.update(
            (key, value) for key, value in (metadata.get("annotations") or {}).items()
            if any(fnmatch.fnmatchcase(key, pattern) for pattern in POD_ANNOTATIONS))
    else:  # containerd's default handler: its default spec, without vcuda's hooks
        del config["hooks"]
    config["annotations"] = annotations
    config["hostname"] = metadata["name"]
    plugin_env, plugin_mounts = device_plugin_spec(devices)
    config["process"].update(terminal=False, args=["/bin/sh", "-c", _PROBE],
                             env=["PATH=/bin", *plugin_env])
    config["mounts"] = [*config["mounts"], *plugin_mounts]
    profile = (container.get("securityContext") or {}).get("seccompProfile") or \
        (pod["spec"].get("securityContext") or {}).get("seccompProfile") or {}
    if profile.get("type") == "RuntimeDefault":
        config["linux"]["seccomp"] = NO_USER_NAMESPACES
    return config


def write_bundle(bundle: Path, config: dict[str, Any]) -> Path:
    """Write ``config`` and a fresh busybox root (its own, as each container's snapshot is)."""
    make_busybox_root(bundle / "rootfs", ("sh", "cat"))
    (bundle / "config.json").write_text(json.dumps(config, indent=2))
    return bundle


class Runc:
    """runc with a state root of its own, so the demo's containers are only the demo's."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run(self, bundle: Path, name: str) -> tuple[dict[str, list[str]] | None, str]:
        """Run the bundle in the foreground; return what the container saw, or None and why not.

        What it saw: for each file it showed, and "raise" (its try to write its
        limits), the lines it printed.
        """
        container_id = f"demo-{name}-{secrets.token_hex(3)}"
        done = subprocess.run(self._command("run", "--bundle", str(bundle), container_id),
                              cwd=bundle, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=120, check=False)
        if done.returncode != 0:
            return None, _why_not_started(done.stderr)
        return _sections(done.stdout), ""

    def delete_all(self) -> list[str]:
        """Kill and delete every container left in this state root; return their IDs."""
        if not self.root.exists():
            return []
        listed = subprocess.run(self._command("list", "-q"), capture_output=True, text=True,
                                timeout=60, check=False)
        ids = listed.stdout.split()
        for container_id in ids:
            subprocess.run(self._command("delete", "-f", container_id), capture_output=True,
                           timeout=60, check=False)
        return ids

    def _command(self, *args: str) -> list[str]:
        return ["runc", "--root", str(self.root), *args]


def _base_spec() -> dict[str, Any]:
    return json.loads(BASE_SPEC.read_text())


def _why_not_started(stderr: str) -> str:
    """The hook's own line when it refused the container, else runc's last line."""
    found = _HOOK_LINE.search(stderr)
    if found:
        return found.group(1).replace('\\"', '"')
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else "runc failed and said nothing"


def _sections(stdout: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("== "):
            current = sections.setdefault(line[3:], [])
        else:
            current.append(line)
    return sections


def seen_lines(seen: dict[str, list[str]]) -> list[str]:
    """What the container saw, as the demo prints it."""
    lines = []
    for name, label in (("/etc/ld.so.preload", "/etc/ld.so.preload:"),
                        ("/etc/vcuda/limits", "/etc/vcuda/limits:"),
                        ("raise", "raising its limits:")):
        for number, line in enumerate(seen.get(name, ())):
            lines.append(f"{label if number == 0 else '':<22}{line}")
    return lines


def limits_problem(seen: dict[str, list[str]], wanted: dict[str, int],
                   devices: tuple[str, ...]) -> str:
    """How what a limited container saw differs from ``wanted`` on ``devices``; '' if not."""
    preload = seen.get("/etc/ld.so.preload", [])
    if not preload or preload[0] != NODE_LIBRARY:
        return "/etc/ld.so.preload does not load libvcuda.so first"
    try:
        limits = parse_limits("\n".join(seen.get(LIMITS_PATH, [])) + "\n")
    except LimitsFormatError as exc:
        return f"{LIMITS_PATH} is not a valid limits file: {exc}"
    expected = Limits(memory=wanted["memory"], cores=wanted["cores"], devices=devices,
                      account=ACCOUNT_PATH)
    if limits != expected:
        return f"{LIMITS_PATH} holds {limits}, expected {expected}"
    if not any("Read-only" in line for line in seen.get("raise", [])):
        return "the container could write /etc/vcuda/limits"
    return ""


def mounts_under(path: Path) -> list[str]:
    """Mount points below ``path`` in this (the host's) mount namespace."""
    with open("/proc/self/mountinfo") as table:
        points = [line.split()[4] for line in table]
    prefix = str(path) + "/"
    return sorted(p for p in points if p.startswith(prefix))


def unmount(point: str) -> None:
    """Detach the mount at ``point`` (lazily: whatever still uses it keeps it)."""
    subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)
