"""``vcuda-node status``: what this node runs, from the install record, the GPUs, the hook's
ledger and the containers' accounts, with the fix for each problem found."""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

from runtime_hook.contract import INVENTORY_NAME, ContractError, read_inventory
from runtime_hook.node.host_root import host_path
from runtime_hook.node.install import Installed, InstallError, installed
from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import Nvml
from runtime_hook.node.observe import Observer, Usage

_FIXES = {  # by the source a problem came from
    "nvml": "check the NVIDIA driver on the node (nvidia-smi); the GPUs shown come from the "
            "hook's inventory, and their use is unknown",
    "inventory": "vcuda-node run rewrites it every interval: check that the agent runs",
    "account": "the container's shim wrote it; its use is left out until it is readable",
    "ledger": "the hook's record of a container; vcuda-node run's poststop cleanup or a "
              "restart of the container releases it",
    "vcuda-run": "a vcuda-run command's directory; it goes when the command ends",
}


class Problem(NamedTuple):
    """Something unusable (``what``), ``why``, and what to do about it."""

    what: str
    why: str
    fix: str  # empty where ``why`` says it


class GpuStatus(NamedTuple):
    """One GPU: memory (bytes) and cores (percent) the limited containers on it committed,
    and which ``sharers`` (namespace/pod/container) they are."""

    index: int  # type: ignore[assignment]  # as GpuState.index
    uuid: str
    memory_total: int
    memory_committed: int
    cores_committed: int
    sharers: list[str]

    @property
    def memory_free(self) -> int:
        return max(0, self.memory_total - self.memory_committed)

    @property
    def cores_free(self) -> int:
        return max(0, 100 - self.cores_committed)


class ContainerStatus(NamedTuple):
    """One limited container on one GPU: its limits and its use (None: unknown)."""

    name: str  # namespace/pod/container
    uuid: str
    memory_limit: int
    cores_limit: int
    memory_used: int | None
    core_used: float | None  # ratio of the GPU
    processes: int | None


class NodeStatus(NamedTuple):
    """What ``vcuda-node status`` shows."""

    prefix: str
    install: Installed | None
    gpus: list[GpuStatus]
    gpus_from: str  # "nvml", or "inventory" while NVML cannot be read
    containers: list[ContainerStatus]
    refused_starts: int | None
    problems: list[Problem]


def gather(host_root: str, prefix: str, state_dir: str, nvml: Nvml) -> NodeStatus:
    """Look at the node under ``host_root``: the install under ``prefix`` and the hook's
    ``state_dir`` (node paths)."""
    quiet = logging.Logger("vcuda-node status")
    quiet.addHandler(logging.NullHandler())  # problems go into the report, not the log
    problems = Problems(quiet, "status")
    found: list[Problem] = []
    try:
        install = installed(host_root, prefix)
    except InstallError as exc:
        install = None
        found.append(Problem(f"{prefix}/installed.json", str(exc), exc.fix))
    if install is None and not found:
        found.append(Problem("install", f"nothing of vcuda is installed under {prefix}",
                             "run vcuda-node install (the vcuda-node DaemonSet's init "
                             "container does), or give --prefix"))
    elif install is not None and install.missing:
        found.append(Problem("install", "gone from the node: " + ", ".join(install.missing),
                             "run vcuda-node install again (restart the vcuda-node pod)"))
    snapshot = Observer(nvml, problems, host_root, state_dir).snapshot()
    gpus_from = "nvml"
    listed = [(g.index, g.uuid, g.memory_total) for g in snapshot.gpus]
    if not snapshot.gpus:
        gpus_from = "inventory"
        listed = _inventory(host_root, state_dir, problems)
    found += [Problem(key, why, _FIXES.get(source, "")) for source, key, why in problems.active()]
    return NodeStatus(prefix, install, _gpus(listed, snapshot.usages), gpus_from,
                      [_container(u) for u in snapshot.usages], snapshot.refused_starts, found)


def _inventory(host_root: str, state_dir: str,
               problems: Problems) -> list[tuple[int, str, int]]:
    path = host_path(host_root, os.path.join(state_dir, INVENTORY_NAME))
    try:
        gpus = read_inventory(path) or {}
    except ContractError as exc:
        problems.report("inventory", "inventory", str(exc))
        return []
    return [(gpu.index, gpu.uuid, gpu.memory) for gpu in gpus.values()]


def _gpus(listed: list[tuple[int, str, int]], usages: list[Usage]) -> list[GpuStatus]:
    found = []
    for index, uuid, memory in sorted(listed, key=lambda g: (g[0], g[1])):
        on_it = [u for u in usages if u.uuid == uuid]
        found.append(GpuStatus(index, uuid, memory, sum(u.workload.memory for u in on_it),
                               sum(u.workload.cores for u in on_it),
                               sorted(_name(u) for u in on_it)))
    return found


def _name(usage: Usage) -> str:
    workload = usage.workload
    return "/".join(p for p in (workload.namespace, workload.pod, workload.container) if p)


def _container(usage: Usage) -> ContainerStatus:
    return ContainerStatus(_name(usage), usage.uuid, usage.workload.memory,
                           usage.workload.cores, usage.memory_used, usage.core_used,
                           usage.processes)


def as_json(status: NodeStatus) -> dict[str, Any]:
    """``status`` as the JSON object ``--json`` prints."""
    install = status.install
    return {
        "installed": install is not None,
        "prefix": status.prefix,
        "runtime": install.runtime if install else None,
        "runtime_config": install.runtime_config if install else [],
        "gpus_from": status.gpus_from,
        "gpus": [{**gpu._asdict(), "memory_free": gpu.memory_free,
                  "cores_free": gpu.cores_free} for gpu in status.gpus],
        "containers": [c._asdict() for c in status.containers],
        "refused_starts": status.refused_starts,
        "problems": [p._asdict() for p in status.problems],
    }


def as_text(status: NodeStatus) -> str:
    """``status`` as lines for a person."""
    install = status.install
    lines = [f"install: {'none' if install is None else install.runtime} under {status.prefix}"]
    if install is not None:
        lines.append("runtime config: " + (", ".join(install.runtime_config) or "none"))
    source = "NVML" if status.gpus_from == "nvml" else "the inventory: NVML unreadable"
    lines.append(f"GPUs (from {source}):")
    for gpu in status.gpus:
        lines.append(f"  {gpu.index} {gpu.uuid}  memory "
                     f"{_gib(gpu.memory_committed)} of {_gib(gpu.memory_total)} committed, "
                     f"{_gib(gpu.memory_free)} free; cores {gpu.cores_committed}% committed, "
                     f"{gpu.cores_free}% free; sharers: {', '.join(gpu.sharers) or 'none'}")
    if not status.gpus:
        lines.append("  none")
    lines.append("limited containers:")
    for c in status.containers:
        used = "unknown" if c.memory_used is None else _gib(c.memory_used)
        busy = "unknown" if c.core_used is None else f"{c.core_used * 100:.0f}%"
        lines.append(f"  {c.name} on {c.uuid}: memory {used} of {_gib(c.memory_limit)}, "
                     f"cores {busy} of {c.cores_limit}%, processes "
                     f"{'unknown' if c.processes is None else c.processes}")
    if not status.containers:
        lines.append("  none")
    if status.refused_starts is not None:
        lines.append(f"starts the hook refused since boot: {status.refused_starts}")
    for problem in status.problems:
        lines.append(f"problem: {problem.what}: {problem.why}")
        if problem.fix:
            lines.append(f"  fix: {problem.fix}")
    return "\n".join(lines) + "\n"


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
