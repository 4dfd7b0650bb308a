"""Reading the shim's shared account file (layout version 2, documented in cshim/README.md).

The shim's processes update the file in place while the agent reads it. No
lock is taken: every figure is one aligned 8-byte store, so a read sees each
whole, and the sums are as exact as a moment's picture can be. The file sits
in a directory the container can write, so it is opened without following
symlinks and must be a regular file of the right size.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from runtime_hook.hook_errors import NodeError
from runtime_hook.node.planted_files import PlantedFileError, read_regular

MAGIC = b"VCUDAACC"
VERSION = 2
# The device table's entry "<UUID>+host" holds a device's virtual memory that lives in host
# memory (cshim/src/region.h).
HOST_SUFFIX = "+host"
_HEADER = struct.Struct("<8sIIIIIIqII")
_UUIDS_AT = 64
_SLOT = struct.Struct("<iIQ16Q")
# header_size, max_devices, max_slots, slot_size, uuid_size of version 2
_GEOMETRY = (4096, 16, 1024, _SLOT.size, 96)
SIZE = _GEOMETRY[0] + _GEOMETRY[2] * _GEOMETRY[3]


class AccountError(NodeError, ValueError):
    """The file is not an account the agent can read; the message says why."""

    fix = "run libvcuda.so and the node agent of one vcuda release"


class Slot(NamedTuple):
    """One process of the account: its pid (as its pid namespace numbers it), its start
    time in clock ticks since boot, and the bytes it holds on each device of the account."""

    pid: int
    start_time: int
    used: tuple[int, ...]


class Account(NamedTuple):
    """What an account holds: its device UUIDs (position = device index) and its busy slots."""

    devices: tuple[str, ...]
    slots: tuple[Slot, ...]

    def used(self, live: set[tuple[int, int]] | None = None) -> dict[str, int]:
        """Bytes in use per device UUID, over the slots whose (pid, start time) is in ``live``
        (every busy slot when ``live`` is None)."""
        totals = dict.fromkeys(self.devices, 0)
        for slot in self.slots:
            if live is None or (slot.pid, slot.start_time) in live:
                for uuid, used in zip(self.devices, slot.used):
                    totals[uuid] += used
        return totals


def read(path: str, owner: int | None = None) -> Account | None:
    """Read the account at ``path``; None when it does not exist (no process used CUDA yet).

    ``owner``: the uid the file must belong to (a vcuda-run command's user: an account of
    another user is not this command's to report); None: any (a container's tmpfs).
    """
    try:
        found = read_regular(path, SIZE, owner=owner)
    except PlantedFileError as exc:
        raise AccountError(f"account {path} {exc}") from None
    if found is None:
        return None
    data, _ = found
    return parse(data, path)


def parse(data: bytes, name: str = "account") -> Account:
    """Decode an account file's bytes; raise AccountError when they are not one."""
    if len(data) < SIZE:
        raise AccountError(f"{name} has {len(data)} bytes, an account has {SIZE}")
    magic, version, *geometry, _reap, ndevices, bound = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise AccountError(f"{name} is not a vcuda account (magic {magic!r})")
    if version != VERSION or tuple(geometry) != _GEOMETRY:
        raise AccountError(f"{name} has layout version {version} {tuple(geometry)}, not {VERSION}")
    header_size, max_devices, max_slots, slot_size, uuid_size = _GEOMETRY
    if ndevices > max_devices or bound > max_slots:
        raise AccountError(f"{name} claims {ndevices} devices and {bound} slots")
    devices = []
    for index in range(ndevices):
        raw = data[_UUIDS_AT + index * uuid_size : _UUIDS_AT + (index + 1) * uuid_size]
        devices.append(raw.split(b"\0", 1)[0].decode("ascii", "replace"))
    slots = []
    for index in range(bound):
        pid, _, start_time, *used = _SLOT.unpack_from(data, header_size + index * slot_size)
        if pid > 0:
            slots.append(Slot(pid, start_time, tuple(used[:ndevices])))
    return Account(tuple(devices), tuple(slots))
