"""Account files written byte by byte from the layout cshim/README.md documents (version 2)."""

from __future__ import annotations

import struct
from pathlib import Path

_HEADER = struct.Struct("<8sIIIIIIqII")
_SLOT = struct.Struct("<iIQ16Q")
SIZE = 4096 + 1024 * _SLOT.size


def account_bytes(devices: list[str], slots: list[tuple[int, int, list[int]]],
                  bound: int | None = None) -> bytes:
    """An account of ``devices`` (UUIDs) and ``slots``: (pid, start time, bytes per device)."""
    data = bytearray(SIZE)
    slot_bound = len(slots) if bound is None else bound
    _HEADER.pack_into(data, 0, b"VCUDAACC", 2, 4096, 16, 1024, _SLOT.size, 96, 0, len(devices),
                      slot_bound)
    for index, uuid in enumerate(devices):
        raw = uuid.encode()
        data[64 + index * 96 : 64 + index * 96 + len(raw)] = raw
    for index, (pid, start, used) in enumerate(slots):
        _SLOT.pack_into(data, 4096 + index * _SLOT.size, pid, 0, start,
                        *(list(used) + [0] * (16 - len(used))))
    return bytes(data)


def write_account(path: Path, devices: list[str], slots: list[tuple[int, int, list[int]]]) -> Path:
    """Write an account file at ``path`` (mode 0666, as the shim creates it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(account_bytes(devices, slots))
    path.chmod(0o666)
    return path
