"""What the demo needs of this machine, found out before it starts anything."""

from __future__ import annotations

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
from typing import NamedTuple

from demo.gpu import GIB, GpuSearch, find_gpus
from tests.busybox_root import BUSYBOX

# The modules the webhook and the demo's client import; pip names where they differ.
MODULES = {"aiohttp": "aiohttp", "msgspec": "msgspec", "structlog": "structlog",
           "prometheus_client": "prometheus-client", "cryptography": "cryptography",
           "jsonpatch": "jsonpatch"}
HOOK_PYTHON = "/usr/bin/python3"  # the hook's interpreter, as manifests/node wires it
_PT_INTERP = 3


class Machine(NamedTuple):
    """What is there, and what is missing, for each part of the demo.

    ``admission_missing`` and ``containers_missing`` hold one line per problem
    (with its fix); ``facts`` one line per thing checked, for the output.
    """

    facts: list[str]
    admission_missing: list[str]
    containers_missing: list[str]
    gpus: GpuSearch


def check_machine() -> Machine:
    """Look at this machine: Python modules, root, runc, busybox-static, the hook's Python, GPUs."""
    facts: list[str] = []
    admission: list[str] = []
    containers: list[str] = []

    missing = [name for name in MODULES if importlib.util.find_spec(name) is None]
    if missing:
        packages = " ".join(MODULES[name] for name in missing)
        admission.append(f"{sys.executable} lacks the Python modules {', '.join(missing)}: run "
                         f"bash scripts/demo without --python (it sets up .venv), or install "
                         f"them: {sys.executable} -m pip install {packages}")
    facts.append(f"webhook's Python:  {sys.executable}, "
                 + (f"missing {', '.join(missing)}" if missing else "with all its modules"))

    root = os.geteuid() == 0
    facts.append(f"root:              {'yes' if root else 'no'}")
    if not root:
        containers.append("not root: runc needs root to create a container's namespaces and "
                          "mounts; run the demo as root (sudo bash scripts/demo)")

    runc = shutil.which("runc")
    facts.append(f"runc:              {_version(runc) if runc else 'not found'}")
    if not runc:
        containers.append("runc not found: bash scripts/setup installs it (Debian: apt-get "
                          "install runc), or put a runc binary on PATH")

    busybox = _busybox_problem()
    facts.append(f"busybox:           {busybox or BUSYBOX + ', statically linked'}")
    if busybox:
        containers.append(f"busybox: {busybox}; bash scripts/setup installs it (Debian: "
                          "apt-get install busybox-static), or put a static busybox on PATH")

    hook_python = os.access(HOOK_PYTHON, os.X_OK)
    facts.append(f"hook's Python:     {_version(HOOK_PYTHON) if hook_python else 'not found'}")
    if not hook_python:
        containers.append(f"{HOOK_PYTHON} not found: the hook runs as {HOOK_PYTHON} (as "
                          "manifests/node wires it); install python3")

    gpus = find_gpus()
    facts.append("NVIDIA GPUs:       " + (", ".join(
        f"{gpu.uuid} ({gpu.memory / GIB:.1f} GiB)" for gpu in gpus.gpus) or f"none: "
        f"{gpus.why_none}"))
    return Machine(facts, admission, containers, gpus)


def _version(program: str) -> str:
    done = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30,
                          check=False)
    said = (done.stdout or done.stderr).strip().splitlines()
    return f"{program} ({said[0]})" if said else program


def _busybox_problem() -> str:
    """Why BUSYBOX cannot be a container's only program, or '' when it can."""
    try:
        with open(BUSYBOX, "rb") as binary:
            if _dynamically_linked(binary.read(1 << 16)):
                return f"{BUSYBOX} is dynamically linked, so it cannot run alone in a container"
    except FileNotFoundError:
        return "not found"
    except ValueError:
        return f"{BUSYBOX} is not a 64-bit little-endian ELF program"
    return ""


def _dynamically_linked(head: bytes) -> bool:
    """Whether the ELF program starting with ``head`` names a program interpreter (ld.so)."""
    if head[:4] != b"\x7fELF" or head[4:6] != b"\x02\x01":
        raise ValueError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", head, 0x20)
    entry_size, count = struct.unpack_from("<HH", head, 0x36)
    for number in range(count):
        p_type, = struct.unpack_from("<I", head, phoff + number * entry_size)
        if p_type == _PT_INTERP:
            return True
    return False
