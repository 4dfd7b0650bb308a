"""Fake nodes for the installer: a host root with the node's own Python, a shell and systemctl.

The installer runs programs of the node inside its root (``chroot``): the
node's ``python3`` checks the hook, ``systemctl`` restarts the runtime. So
the root holds a copy of this machine's Python binary, whose standard
library (``/usr/lib``, ``/usr/lib64``) is bind-mounted read-only in a
private mount namespace of the installer's process alone; ``sh`` is
busybox-static, and ``systemctl`` a script that records its arguments.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.busybox_root import BUSYBOX
from tests.hook.bundles import snapshot

REPO = Path(__file__).resolve().parents[2]
_LIBRARY_DIRS = [d for d in ("usr/lib", "usr/lib64") if os.path.isdir(f"/{d}")]
_AS_MODULE = ("-m", "runtime_hook.node")
_SYSTEMCTL = '#!/bin/sh\necho "$@" >> /var/log/systemctl.calls\n'


@dataclass
class Node:
    """A host root for ``vcuda-node install --host-root``."""

    root: Path

    def path(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def write(self, node_path: str, text: str) -> Path:
        path = self.path(node_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def restarts(self) -> list[str]:
        """The ``systemctl`` calls the installer made, in order."""
        calls = self.path("/var/log/systemctl.calls")
        return calls.read_text().splitlines() if calls.exists() else []

    def command(self, *args: str, python: tuple[str, ...] = _AS_MODULE) -> list[str]:
        """``vcuda-node ARGS --host-root ROOT`` in a mount namespace with the node's libraries."""
        binds = " && ".join(
            f"mount --bind -o ro /{d} {self.root / d}" for d in _LIBRARY_DIRS
        )
        return [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", f'{binds} && exec "$@"', "sh",
            sys.executable, *python, *args, "--host-root", str(self.root),
        ]  # fmt: skip

    def run(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run ``vcuda-node`` on this node; output captured, never raises on failure."""
        return subprocess.run(
            self.command(*args, **kwargs),  # type: ignore[arg-type]
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def tree(self) -> dict[str, tuple]:
        """Every path of the root with its type and mode, owner, and content or link target."""
        found = snapshot(self.root)
        return {path: (mode, uid, body) for path, (mode, uid, _, body) in found.items()}


def make_node(root: Path, python: bool = True,
              nvidia_runtime: str | None = "/usr/bin/nvidia-container-runtime") -> Node:
    """A root with ``sh``, a recording ``systemctl``, NVIDIA's runtime at ``nvidia_runtime``
    and, if ``python``, ``/usr/bin/python3``."""
    for directory in ("usr/bin", "var/log", *_LIBRARY_DIRS):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (root / link).symlink_to(target)
    shutil.copy2(BUSYBOX, root / "usr/bin/sh")
    (root / "usr/bin/systemctl").write_text(_SYSTEMCTL)
    (root / "usr/bin/systemctl").chmod(0o755)
    if nvidia_runtime:  # the handler runs it; install looks for it, never runs it
        (root / nvidia_runtime.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / nvidia_runtime.lstrip("/")).write_text("#!/bin/sh\n")
        (root / nvidia_runtime.lstrip("/")).chmod(0o755)
    if python:
        shutil.copy2(os.path.realpath("/usr/bin/python3"), root / "usr/bin/python3")
    return Node(root)
