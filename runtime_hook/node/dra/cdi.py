"""The transient CDI spec of one prepared claim: what the runtime adds to each of its containers.

Kubelet hands the runtime the CDI device names that Prepare returned; the
runtime (containerd, CRI-O, podman) reads the spec from its CDI directory
(``/var/run/cdi`` holds transient ones) and applies its container edits:

    /usr/local/vcuda/lib   the directory of the node's library (read-only)
    /etc/vcuda             the claim's ledger record: its limits file (read-only)
    /etc/ld.so.preload     the library's line (read-only)
    /run/vcuda             the claim's account directory (read-write)

Directories are mounted where the shim's paths allow, not single files: a
mountpoint cannot be renamed, so root in the container cannot move
``/etc/vcuda`` aside and leave the library without its limits. Unlike the
hook, a CDI spec cannot make the image's own ``/etc`` a mount point: root in
the container can still rename ``/etc`` and start processes without the
preload list (docs/DRA.md, "Limits of the DRA path").

The GPU itself comes from NVIDIA's CDI spec (``nvidia-ctk cdi generate``),
whose device ``nvidia.com/gpu=<uuid>`` Prepare names beside this one.
"""

from __future__ import annotations

import os
from typing import Any

from runtime_hook import inject
from runtime_hook.contract import ACCOUNT_MOUNT, LIMITS_PATH
from runtime_hook.hook_errors import UsageError
from runtime_hook.node import cdi_files
from runtime_hook.node_state import ACCOUNT_DIR, LIMITS_FILE, PRELOAD_FILE

assert os.path.basename(LIMITS_PATH) == LIMITS_FILE  # /etc/vcuda is the record itself

KIND = "vcuda.io/claim"
NVIDIA_KIND = "nvidia.com/gpu"

_READ_ONLY = ["ro", "bind", "nosuid", "nodev"]


def device_id(claim_uid: str) -> str:
    """The fully qualified CDI name of a claim's vcuda device."""
    return f"{KIND}={claim_uid}"


def gpu_id(uuid: str, kind: str = NVIDIA_KIND) -> str:
    """NVIDIA's CDI name of the GPU ``uuid`` (its spec names devices by UUID)."""
    return f"{kind}={uuid}"


def spec_path(directory: str, claim_uid: str) -> str:
    """Where the spec of ``claim_uid`` lives in the CDI ``directory``."""
    return cdi_files.spec_path(directory, KIND, claim_uid)


def spec(claim_uid: str, record: str, library: str) -> dict[str, Any]:
    """The CDI spec of a claim whose ledger record (host path) is ``record``.

    ``library`` is the host path of libvcuda.so; its directory is mounted, so
    its name must be the one the container's preload list gives.
    """
    if os.path.basename(library) != os.path.basename(inject.LIBRARY_PATH):
        raise UsageError(f"the library {library} must be named "
                         f"{os.path.basename(inject.LIBRARY_PATH)}",
                         "give vcuda-node run --library the installed libvcuda.so")
    data = [*_READ_ONLY, "noexec"]
    mounts = [
        (os.path.dirname(library), os.path.dirname(inject.LIBRARY_PATH), _READ_ONLY),
        (record, os.path.dirname(LIMITS_PATH), data),
        (os.path.join(record, PRELOAD_FILE), inject.PRELOAD_PATH, data),
        (os.path.join(record, ACCOUNT_DIR), ACCOUNT_MOUNT,
         ["rw", "bind", "nosuid", "nodev", "noexec"]),
    ]
    return cdi_files.spec(KIND, [{
        "name": claim_uid,
        "containerEdits": {"mounts": [
            {"hostPath": host, "containerPath": target, "options": options}
            for host, target, options in mounts
        ]},
    }])

