"""The GPU inventory file: this node's GPUs (UUID, index, memory), written by the node agent.

The hook reads it to turn indices in ``NVIDIA_VISIBLE_DEVICES`` into UUIDs and to
know how much memory each GPU can give out. Format (JSON, UTF-8)::

    {"version": 1,
     "gpus": [{"uuid": "GPU-5c3d...", "index": 0, "memory": 85899345920}, ...]}

``memory`` is the GPU's total memory in bytes. Writers replace the file
atomically (:func:`write`), so readers never see half a file. Standard library
only: the hook imports it on the start of every limited container.
"""

from __future__ import annotations

import os

from runtime_hook import fast_json
from runtime_hook.record import Record

FORMAT_VERSION = 1


class InventoryError(ValueError):
    """The inventory file exists but cannot be used; the message says why."""


class Gpu(Record):
    """One GPU of the node: its UUID, its index, its total memory in bytes."""

    _fields = ("uuid", "index", "memory")
    __slots__ = _fields


def write(path: str, gpus: list[Gpu]) -> None:
    """Replace the inventory at ``path`` with ``gpus``, atomically."""
    import json  # only the node agent writes: the hook, which only reads, need not load it

    body = {
        "version": FORMAT_VERSION,
        "gpus": [{"uuid": g.uuid, "index": g.index, "memory": g.memory} for g in gpus],
    }
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(body, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def read(path: str) -> dict[str, Gpu] | None:
    """Return the GPUs by UUID, or None when the file does not exist."""
    try:
        with open(path, "rb") as src:
            text = src.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InventoryError(f"GPU inventory {path} cannot be read: {exc.strerror}") from None
    try:
        body = fast_json.loads(text)
        if body["version"] != FORMAT_VERSION:
            raise InventoryError(f"GPU inventory {path} has version {body['version']!r}")
        gpus = [_gpu(entry) for entry in body["gpus"]]
    except InventoryError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise InventoryError(f"GPU inventory {path} is malformed ({exc!r})") from None
    return {g.uuid: g for g in gpus}


def _gpu(entry: dict) -> Gpu:
    uuid, index, memory = entry["uuid"], entry["index"], entry["memory"]
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"uuid {uuid!r}")
    for name, value in (("index", index), ("memory", memory)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} {value!r} of {uuid}")
    return Gpu(uuid=uuid, index=index, memory=memory)
