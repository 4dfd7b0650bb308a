"""podman (Debian's, root) as the tests run it, on machines whose cgroups or limits are unusual.

runc and cgroupfs work on cgroup v1, v2 and hybrid hosts alike (crun refuses
hybrid ones); a container's open-file and process limits are ones this
machine's root may set (podman's defaults are above some CI machines' hard
limits).
"""

from __future__ import annotations

import os
import shutil

import pytest

PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs")
LIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def require_podman(why: str) -> None:
    """Skip the calling test unless this is root with podman and unshare (scripts/setup)."""
    if os.geteuid() != 0 or not shutil.which("podman") or not shutil.which("unshare"):
        pytest.skip(f"podman (scripts/setup installs it), unshare and root are needed {why}")
