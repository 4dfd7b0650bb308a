"""Which host process is pid N of a container: an index of pid namespaces built from /proc.

The shim records each process under the pid its own pid namespace gives it
(``getpid()`` inside the container), while NVML and the ledger give host pids.
The agent reads the host's procfs (``<host root>/proc``: the node's ``/proc``,
which numbers processes as the host does, whatever pid namespace the agent
itself runs in). Every process's ``/proc/<pid>/status`` there lists its pid in
each namespace from the host's down (``NSpid``); the last is the one the
container sees. So the agent finds the container's namespace through its
first process (the ledger's owner pid), then takes every host process in that
namespace with its innermost pid.
Processes in a namespace nested inside the container's are not matched.
A standalone ``vcuda-run`` command lives in the host's namespace, where both
numbers are the same.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple

from runtime_hook.node_state import process_start_time


class Process(NamedTuple):
    """A live process: its pid in the host's namespace and its start time (clock ticks)."""

    host_pid: int
    start_time: int


def pid_namespace(pid: int, proc: str) -> int | None:
    """The inode of host process ``pid``'s pid namespace, or None when it is gone (or hidden).

    ``proc``: the host's procfs.
    """
    try:
        return os.stat(f"{proc}/{pid}/ns/pid").st_ino
    except OSError:
        return None


def index(namespaces: Iterable[int], proc: str) -> dict[int, dict[int, Process]]:
    """For each pid namespace in ``namespaces``: its processes by the pid they have in it.

    ``proc``: the host's procfs.
    """
    wanted = set(namespaces)
    found: dict[int, dict[int, Process]] = {ns: {} for ns in wanted}
    if not wanted:
        return found
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        host_pid = int(name)
        ns = pid_namespace(host_pid, proc)
        if ns not in wanted:
            continue
        inner, start = _innermost_pid(host_pid, proc), process_start_time(host_pid, proc)
        if inner is not None and start is not None:
            found[ns][inner] = Process(host_pid, start)
    return found


def _innermost_pid(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/status", "rb") as src:
            for line in src:
                if line.startswith(b"NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None
