"""CDI spec files on the node: where runtimes read them, their header, and writing them whole.

Both ways vcuda hands devices to containers end in a CDI spec: the device
plugin of per-GPU placement (one spec per slot) and the DRA driver (one per
prepared claim). The runtime (containerd, CRI-O, podman) resolves a device name
against the specs of its CDI directories when it creates a container.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

# 0.5.0 has everything vcuda's specs use (mounts, env), and every CDI-capable runtime reads
# it (podman 4.3, containerd 1.7, CRI-O 1.28 included).
CDI_VERSION = "0.5.0"
DEFAULT_DIR = "/var/run/cdi"  # transient specs: gone with the node's reboot, as they should be


def spec(kind: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    """A spec of ``kind`` (``vendor/class``) holding ``devices``."""
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices}


def spec_path(directory: str, kind: str, name: str) -> str:
    """Where the spec of device ``name`` of ``kind`` lives in the CDI ``directory``."""
    return os.path.join(directory, f"{file_prefix(kind)}{name}.json")


def file_prefix(kind: str) -> str:
    """How the names of ``kind``'s spec files begin (see :func:`spec_path`)."""
    return f"{kind.replace('/', '-')}_"


def write(path: str, body: dict[str, Any]) -> None:
    """Write the spec ``body`` to ``path`` whole: a runtime never reads half of it.

    No fsync: specs live in /var/run, which a reboot empties anyway; the rename is what
    readers rely on.
    """
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    # A name runtimes skip (not .json), unique to this call: writers run in threads.
    fd, partial = tempfile.mkstemp(dir=directory, prefix=".", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(body, out, indent=1, sort_keys=True)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        remove(partial)
        raise


def remove(path: str) -> bool:
    """Remove the spec at ``path``; return whether there was one."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
