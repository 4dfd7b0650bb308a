"""One picture of the node: each GPU, and on it each workload's limits and use.

Memory use is read from the workload's shared account, counting only the
slots of processes that still run (the shim frees a dead process's slot
lazily). The account lives in a directory the container writes, so it is
the container's own report: the driver's per-process accounting (NVML) of
every process in the container's pid namespace is reported beside it, with
the processes that hold GPU memory but no slot of the account (a process that
bypassed the shim, or an account that was rewritten). Compute use is NVML's
per-process SM utilization summed over the account's processes, whose pids are
turned into host pids through their pid namespace
(:mod:`runtime_hook.node.processes`). Whatever cannot be read
is reported to :class:`~runtime_hook.node.logs.Problems` and left out; the
rest of the picture stands.

Which GPUs a workload is shown on never comes from its account: a container
is on the GPUs of its ledger record, a vcuda-run command on those of its limits
(every GPU it used, by its account, when they name none) that the node has
(NVML or the GPU inventory). So a GPU UUID that a container writes in its
account is neither a label value nor a GPU the container is counted on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from runtime_hook.contract import INVENTORY_NAME, ContractError, read_inventory
from runtime_hook.node import account, processes, workloads
from runtime_hook.node.host_root import host_path
from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import GpuState, Nvml, NvmlError


class Usage(NamedTuple):
    """One workload on one GPU: ``index`` (None when NVML does not know the UUID), memory in
    use in bytes as its account says, compute in use as a ratio of the GPU (None when NVML
    cannot tell), and how many of its processes hold memory there. ``memory_used`` and
    ``processes`` are None when its account cannot be read. ``memory_driver`` is what the
    driver says its processes hold there, ``unaccounted`` how many of those hold memory
    with no slot in the account (both None when NVML cannot tell)."""

    workload: workloads.Workload
    uuid: str
    index: int | None  # type: ignore[assignment]  # as GpuState.index
    memory_used: int | None
    core_used: float | None
    processes: int | None
    memory_driver: int | None = None
    unaccounted: int | None = None
    memory_in_host: int | None = None  # of memory_used, virtual memory that lives in host memory


class Snapshot(NamedTuple):
    """The GPUs NVML reads (``GpuState`` list), the ``Usage`` of every workload, and the starts
    the hook refused on the node (None: unreadable)."""

    gpus: list[GpuState]
    usages: list[Usage]
    refused_starts: int | None = None


class Observer:
    """Takes snapshots of the node; ``run_dirs`` are where vcuda-run commands keep their files."""

    def __init__(
        self,
        nvml: Nvml,
        problems: Problems,
        host_root: str = "/",
        state_dir: str = "/run/vcuda",
        run_dirs: tuple[str, ...] = (),
    ) -> None:
        self._nvml = nvml
        self.problems = problems
        self._host_root = host_root
        self._state_dir = state_dir
        self._run_dirs = list(run_dirs)
        self._indices: dict[str, int] = {}  # UUID -> index, kept while NVML is away

    def snapshot(self) -> Snapshot:
        """Look at the node now."""
        problems = self.problems
        utilization: _PerGpu | None = _PerGpu(
            self._nvml.process_utilization, "utilization", problems
        )
        held: _PerGpu | None = _PerGpu(self._nvml.process_memory, "compute processes", problems)
        try:
            gpus = self._nvml.gpus(problems)
            self._indices = {gpu.uuid: gpu.index for gpu in gpus}
        except NvmlError as exc:
            problems.report("nvml", "NVML", str(exc))
            gpus, utilization, held = [], None, None
        known = self._known(gpus)
        proc = host_path(self._host_root, "/proc")  # the host's: NVML gives host pids
        found = workloads.containers(self._host_root, self._state_dir, proc, problems)
        found += workloads.commands(self._host_root, self._run_dirs, proc, problems)
        namespaces = {w: processes.pid_namespace(w.pid, proc) for w in found}
        by_namespace = processes.index((ns for ns in namespaces.values() if ns is not None), proc)
        host_namespace = processes.pid_namespace(1, proc)
        usages = []
        for workload in found:
            namespace = namespaces[workload]
            live = by_namespace.get(namespace, {}) if namespace is not None else {}
            # A container's every process is its own; in the host's namespace (a
            # vcuda-run command), only the processes of its account are.
            own = namespace is not None and namespace != host_namespace
            usages += self._usages(workload, known, live, utilization, held if own else None)
        refused = workloads.refused_starts(self._host_root, self._state_dir, problems)
        problems.cycle_done()
        return Snapshot(gpus, usages, refused)

    def _known(self, gpus: list[GpuState]) -> dict[str, str]:
        """The node's GPU and MIG UUIDs (NVML's now and before, the inventory's), by lower
        case: what a workload may be shown on."""
        uuids = [*self._indices, *(gpu.uuid for gpu in gpus)]
        path = host_path(self._host_root, os.path.join(self._state_dir, INVENTORY_NAME))
        try:
            uuids += read_inventory(path) or ()
        except ContractError as exc:
            self.problems.report("inventory", path, str(exc))
        return {uuid.lower(): uuid for uuid in uuids}

    def _devices(self, workload: workloads.Workload, held: account.Account | None,
                 known: dict[str, str]) -> tuple[str, ...]:
        """The GPUs ``workload`` is shown on (see the module's docstring); an account that
        names others is reported."""
        written = tuple(d for d in held.devices if not d.endswith(account.HOST_SUFFIX)) \
            if held else ()
        if workload.user is None:  # a container: its ledger record says
            by_index = {str(index): uuid for uuid, index in self._indices.items()}
            trusted = tuple(by_index.get(d, d) for d in workload.devices)  # no inventory: indices
            foreign = [d for d in written if d.lower() not in {t.lower() for t in trusted}]
        else:
            named = workload.devices or written
            trusted = tuple(known[d.lower()] for d in named if d.lower() in known)
            foreign = [d for d in named if d.lower() not in known]
        if foreign:
            shown = ", ".join(repr(d[:100]) for d in foreign[:4])
            self.problems.report("account", f"{workload.account} devices",
                                 f"names {len(foreign)} GPU(s) that are not this workload's "
                                 f"or not this node's ({shown}): left out")
        return tuple(dict.fromkeys(trusted))

    def _usages(
        self,
        workload: workloads.Workload,
        known: dict[str, str],
        live: dict[int, processes.Process],
        utilization: _PerGpu | None,
        held_by_pid: _PerGpu | None,
    ) -> list[Usage]:
        """``workload``'s use of each of its GPUs; ``known``: the node's GPUs by lower case
        UUID; ``live``: its processes by account pid (``utilization`` is None while NVML is
        away; ``held_by_pid`` also for a command)."""
        try:
            held = account.read(workload.account, workload.user) or account.Account((), ())
        except account.AccountError as exc:
            self.problems.report("account", workload.account, str(exc))
            held = None
        devices = self._devices(workload, held, known)
        if held is None:  # limits only
            return [Usage(workload, u, self._indices.get(u), None, None, None) for u in devices]
        slots = [s for s in held.slots if s.pid in live and live[s.pid].start_time == s.start_time]
        used = held.used({(s.pid, s.start_time) for s in slots})
        host_pids = [live[s.pid].host_pid for s in slots]
        positions = {uuid.lower(): n for n, uuid in enumerate(held.devices)}
        usages = []
        for uuid in devices:
            index = self._indices.get(uuid)
            busy = utilization.of(index) if utilization and index is not None else None
            core_used = None if busy is None else sum(busy.get(p, 0) for p in host_pids) / 100
            on_it = positions.get(uuid.lower())
            in_host = positions.get(uuid.lower() + account.HOST_SUFFIX)
            entries = [n for n in (on_it, in_host) if n is not None]  # device part, host part
            driver = held_by_pid.of(index) if held_by_pid and index is not None else None
            mine = {} if driver is None else {
                p.host_pid: driver[p.host_pid] for p in live.values() if p.host_pid in driver}
            slotted = {live[s.pid].host_pid for s in slots if on_it is not None and s.used[on_it]}
            usages.append(
                Usage(
                    workload=workload,
                    uuid=uuid,
                    index=index,
                    memory_used=sum(used[held.devices[n]] for n in entries),
                    memory_in_host=0 if in_host is None else used[held.devices[in_host]],
                    core_used=core_used,
                    processes=sum(1 for s in slots if any(s.used[n] for n in entries)),
                    memory_driver=None if driver is None else sum(mine.values()),
                    unaccounted=None if driver is None else len(
                        [p for p, size in mine.items() if size and p not in slotted]),
                )
            )
        return usages


class _PerGpu:
    """A per-process figure of each GPU (by host pid), asked of NVML at most once per snapshot."""

    def __init__(self, query: Callable[[int], dict[int, int]], what: str,
                 problems: Problems) -> None:
        self._query = query
        self._what = what
        self._problems = problems
        self._by_index: dict[int, dict[int, int] | None] = {}

    def of(self, index: int) -> dict[int, int] | None:
        if index not in self._by_index:
            try:
                self._by_index[index] = self._query(index)
            except NvmlError as exc:
                self._problems.report("nvml", f"GPU {index} {self._what}", str(exc))
                self._by_index[index] = None
        return self._by_index[index]

