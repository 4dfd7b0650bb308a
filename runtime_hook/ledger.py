"""The node ledger: the GPU memory and time each running limited container committed on this node.

Each record is a directory of :class:`~runtime_hook.node_state.StateDir`,
built under a temporary name and renamed, so it appears whole or not at all.
Its ``entry`` file holds ``key=value`` lines (devices comma-separated)::

    container_id=3f2a9c1b...
    namespace=default
    pod=train-0
    container=worker
    memory=10737418240
    cores=30
    devices=GPU-5c3d...,GPU-81aa...

and ``owner`` beside it the pid and start time. The node agent reads the same
records (:func:`entries`); ``account/`` in them is writable by the container,
so open files there with ``O_NOFOLLOW`` and check that they are regular.
"""

from __future__ import annotations

import os

from runtime_hook.hook_errors import NodeError
from runtime_hook.node_state import ACCOUNT_DIR, OWNER_FILE, StateDir
from runtime_hook.record import Record

ENTRY_FILE = "entry"
_NUMBERS = ("memory", "cores")


class DuplicateError(NodeError, RuntimeError):
    """A record for this container id exists already."""


class Entry(Record):
    """What one limited container committed on this node.

    Its ids and names (str), the ``pid`` and ``start_time`` of its first
    process, ``memory`` in bytes and ``cores`` in percent on each of ``devices``
    (a tuple of GPU UUIDs).
    """

    _fields = (
        "container_id",
        "namespace",
        "pod",
        "container",
        "pid",
        "start_time",
        "memory",
        "cores",
        "devices",
    )
    __slots__ = _fields
    container_id: str
    namespace: str
    pod: str
    container: str
    pid: int
    start_time: int
    memory: int
    cores: int
    devices: tuple[str, ...]


def commit(state: StateDir, entry: Entry) -> str:
    """Record ``entry`` (hold the lock); return its container directory."""
    body = entry._asdict()
    owner = f"{body.pop('pid')} {body.pop('start_time')}\n"
    body["devices"] = ",".join(entry.devices)
    if any("\n" in str(value) for value in body.values()):
        raise ValueError(f"a field of {entry!r} holds a line break")
    lines = "".join(f"{key}={value}\n" for key, value in body.items())
    final = state.container_dir(entry.container_id)
    building = os.path.join(state.containers, f".new-{os.getpid()}")
    os.mkdir(building, 0o755)
    for name, text in ((OWNER_FILE, owner), (ENTRY_FILE, lines)):
        with open(os.path.join(building, name), "w", encoding="utf-8") as out:
            out.write(text)
    os.mkdir(os.path.join(building, ACCOUNT_DIR), 0o755)
    try:
        os.rename(building, final)
    except OSError:
        state.release(os.path.basename(building))
        raise DuplicateError(f"{final} exists already") from None
    return final


def entries(state: StateDir) -> list[Entry]:
    """Every readable record; records that are half-removed or damaged are skipped."""
    found = []
    for name in sorted(os.listdir(state.containers)):
        record = state.container_dir(name)
        try:
            with open(os.path.join(record, OWNER_FILE), "rb") as src:
                pid, start_time = (int(word) for word in src.read().split())
            with open(os.path.join(record, ENTRY_FILE), encoding="utf-8") as src:
                text = dict(line.split("=", 1) for line in src.read().splitlines())
            body: dict[str, object] = dict(text)
            for key in _NUMBERS:
                body[key] = int(text[key])
            body["devices"] = tuple(d for d in text["devices"].split(",") if d)
            found.append(Entry(pid=pid, start_time=start_time, **body))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return found


def committed(records: list[Entry]) -> dict[str, tuple[int, int]]:
    """Sum the (memory, cores) committed on each GPU UUID."""
    total: dict[str, tuple[int, int]] = {}
    for entry in records:
        for uuid in entry.devices:
            memory, cores = total.get(uuid, (0, 0))
            total[uuid] = (memory + entry.memory, cores + entry.cores)
    return total


def sharers(records: list[Entry]) -> dict[str, int]:
    """Count the limited containers (and DRA claims) on each GPU UUID."""
    total: dict[str, int] = {}
    for entry in records:
        for uuid in entry.devices:
            total[uuid] = total.get(uuid, 0) + 1
    return total
