"""The demo's GPU side: this machine's NVIDIA GPUs, and a CUDA program run under vcuda-run."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any, NamedTuple

from demo.commands import REPO, vcuda_command
from demo.gpu_probe import NO_CUDA_LIBRARY
from runtime_hook.contract import Gpu

GIB = 1 << 30
# Stands in for the node agent's inventory where there is no GPU; the UUIDs say they are made up.
MADE_UP_GPUS = tuple(Gpu(f"GPU-00000000-0000-0000-0000-00000000000{i}", i, 80 * GIB)
                     for i in range(2))
PROBE = "demo/gpu_probe.py"
_PROBE_TIMEOUT = 300


class GpuSearch(NamedTuple):
    """The GPUs nvidia-smi lists, or why there are none."""

    gpus: tuple[Gpu, ...]
    why_none: str


class ProbeResult(NamedTuple):
    """What the CUDA program printed, and the result line it ended with (None: no such line)."""

    command: list[str]
    exit_status: int
    lines: list[str]
    result: dict[str, Any] | None


def find_gpus() -> GpuSearch:
    """The NVIDIA GPUs of this machine: ``nvidia-smi -L`` must work, then their UUIDs and memory."""
    if not shutil.which("nvidia-smi"):
        return GpuSearch((), "nvidia-smi is not installed")
    listed = _nvidia_smi("-L")
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        said = (listed.stderr or listed.stdout).strip().splitlines()
        return GpuSearch((), f"nvidia-smi -L failed: {said[0] if said else listed.returncode}")
    query = _nvidia_smi("--query-gpu=uuid,index,memory.total", "--format=csv,noheader,nounits")
    gpus = []
    for line in query.stdout.splitlines():
        uuid, index, mib = (field.strip() for field in line.split(","))
        gpus.append(Gpu(uuid, int(index), int(mib) << 20))
    return GpuSearch(tuple(gpus), "")


def run_probe(python: str, memory: str, cores: int) -> ProbeResult:
    """Run the CUDA program with ``python`` under ``vcuda-run --memory M --cores C``."""
    command = [*vcuda_command("vcuda-run", "runtime_hook.run"), "--memory", memory,
               "--cores", str(cores), "--", python, PROBE]
    done = subprocess.run(command, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=_PROBE_TIMEOUT, check=False)
    lines = [*done.stdout.splitlines(), *done.stderr.splitlines()]
    result = None
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    shown = [line for line in lines if not line.startswith("RESULT ")]
    return ProbeResult(command, done.returncode, shown, result)


def lacks_cuda_library(probe: ProbeResult) -> bool:
    """Whether the program found neither torch nor cupy."""
    return probe.exit_status == NO_CUDA_LIBRARY and probe.result is None


def _nvidia_smi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60,
                          check=False)
