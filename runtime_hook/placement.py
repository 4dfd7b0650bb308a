"""What per-GPU placement writes into the cluster: the node's GPU inventory, its GPU ledger, a
pod's assignment, and the device-plugin resources that carry the assignment to the node.

Three annotations, all JSON, all written by vcuda only:

- ``vcuda.io/gpus`` on a Node, by the node agent: the GPUs it found and a heartbeat::

      {"version": 1, "heartbeat": 1767225600,
       "gpus": [{"uuid": "GPU-5c3d...", "index": 0, "memory": 85899345920}, ...]}

  ``memory`` is what shared containers may commit on that GPU (its total times the
  agent's memory scaling). A heartbeat older than the extender's limit makes the node
  unschedulable for vcuda pods.
- ``vcuda.io/gpu-ledger`` on a Node, by the scheduler extender at bind (each write
  conditional on the Node's resourceVersion) and pruned by the node agent when pods end::

      {"version": 1, "pods": {"<pod uid>": {"pod": "ns/name", "at": 1767225600,
                                            "shared": ["GPU-...", 30, 10737418240],
                                            "whole": ["GPU-...", ...]}}}

  It is the truth of what each GPU has given out: two binds on one node cannot both
  succeed against the same version of it.
- ``vcuda.io/assigned-gpus`` on a Pod, written with its Binding: the same ``shared`` and
  ``whole`` fields, for the node side and for people to read.

Standard library only: the OCI hook may import it.
"""

from __future__ import annotations

import json

from runtime_hook.contract import (
    ASSIGNMENT_ANNOTATION,
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    ContractError,
    Gpu,
)
from runtime_hook.record import Record

TYPE_CHECKING = False  # typing's, without importing typing (the hook's start-up cost)
if TYPE_CHECKING:
    from collections.abc import Mapping

FORMAT_VERSION = 1


class PlacementError(ContractError):
    """An annotation cannot be read; the message names it and says why."""


class Inventory(Record):
    """A node's GPUs as its agent published them, and when (Unix seconds)."""

    _fields = ("gpus", "heartbeat")
    __slots__ = _fields
    gpus: tuple[Gpu, ...]
    heartbeat: int


class Assignment(Record):
    """The GPUs one pod got: ``shared`` is (uuid, cores, memory bytes) or None; ``whole`` UUIDs."""

    _fields = ("shared", "whole")
    __slots__ = _fields
    shared: tuple[str, int, int] | None
    whole: tuple[str, ...]

    def gpus(self) -> tuple[str, ...]:
        """Every GPU UUID the pod uses."""
        return ((self.shared[0],) if self.shared else ()) + tuple(self.whole)

    def to_json(self) -> dict:
        body: dict = {}
        if self.shared:
            body["shared"] = list(self.shared)
        if self.whole:
            body["whole"] = list(self.whole)
        return body


class Entry(Record):
    """One pod's line in a node's ledger: who (``ns/name``), since when, and its assignment."""

    _fields = ("pod", "at", "assignment")
    __slots__ = _fields
    pod: str
    at: int
    assignment: Assignment


def encode_inventory(gpus: list[Gpu], heartbeat: int) -> str:
    """The value of :data:`INVENTORY_ANNOTATION` for ``gpus`` at ``heartbeat``."""
    return json.dumps({"version": FORMAT_VERSION, "heartbeat": int(heartbeat),
                       "gpus": [{"uuid": g.uuid, "index": g.index, "memory": g.memory}
                                for g in sorted(gpus, key=lambda g: g.index)]},
                      separators=(",", ":"))


def decode_inventory(text: str) -> Inventory:
    """Read :data:`INVENTORY_ANNOTATION`; raise PlacementError naming what is wrong."""
    body = _object(text, INVENTORY_ANNOTATION)
    try:
        heartbeat = body["heartbeat"]
        if not _whole(heartbeat):
            raise ValueError(f"heartbeat {heartbeat!r}")
        gpus: list[Gpu] = []
        for item in body["gpus"]:
            uuid, index, memory = item["uuid"], item["index"], item["memory"]
            if not isinstance(uuid, str) or not uuid or not _whole(index) or not _whole(memory):
                raise ValueError(f"GPU {item!r}")
            if any(gpu.uuid == uuid for gpu in gpus):  # what is given out is counted by UUID
                raise ValueError(f"GPU {uuid} is listed twice")
            gpus.append(Gpu(uuid, index, memory))
    except (KeyError, TypeError, ValueError) as exc:
        raise PlacementError(f"{INVENTORY_ANNOTATION} is malformed: {exc}") from None
    return Inventory(tuple(gpus), heartbeat)


def ledger_document(entries: Mapping[str, Entry]) -> dict:
    """The JSON document of :data:`LEDGER_ANNOTATION` for ``entries`` (by pod uid), in uid
    order."""
    pods = {}
    for uid, entry in sorted(entries.items()):
        item = {"pod": entry.pod, "at": int(entry.at)}
        item.update(entry.assignment.to_json())
        pods[uid] = item
    return {"version": FORMAT_VERSION, "pods": pods}


def encode_ledger(entries: Mapping[str, Entry]) -> str:
    """The value of :data:`LEDGER_ANNOTATION` for ``entries`` (by pod uid)."""
    return json.dumps(ledger_document(entries), separators=(",", ":"))


def decode_ledger(text: str | None) -> dict[str, Entry]:
    """Read :data:`LEDGER_ANNOTATION` (None: no ledger yet) into entries by pod uid."""
    if text is None:
        return {}
    body = _object(text, LEDGER_ANNOTATION)
    try:
        return {uid: Entry(item["pod"], item["at"], assignment_from(item))
                for uid, item in body["pods"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlacementError(f"{LEDGER_ANNOTATION} is malformed: {exc!r}") from None


def encode_assignment(assignment: Assignment) -> str:
    """The value of :data:`ASSIGNMENT_ANNOTATION`."""
    return json.dumps(assignment.to_json(), separators=(",", ":"))


def decode_assignment(text: str) -> Assignment:
    """Read :data:`ASSIGNMENT_ANNOTATION`; raise PlacementError naming what is wrong."""
    body = _object(text, ASSIGNMENT_ANNOTATION)
    try:
        return assignment_from(body)
    except (TypeError, ValueError) as exc:
        raise PlacementError(f"{ASSIGNMENT_ANNOTATION} is malformed: {exc}") from None


def assignment_from(body: dict) -> Assignment:
    """The ``shared`` and ``whole`` fields of a ledger entry or an assignment."""
    shared = body.get("shared")
    if shared is not None:
        uuid, cores, memory = shared
        if not isinstance(uuid, str) or not _whole(cores) or not _whole(memory):
            raise ValueError(f"shared {shared!r}")
        shared = (uuid, cores, memory)
    whole = body.get("whole") or []
    if not all(isinstance(uuid, str) and uuid for uuid in whole):
        raise ValueError(f"whole {whole!r}")
    return Assignment(shared, tuple(whole))


def _object(text: str, name: str) -> dict:
    try:
        body = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise PlacementError(f"{name} is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise PlacementError(f"{name} is not a JSON object")
    if body.get("version", FORMAT_VERSION) != FORMAT_VERSION:
        raise PlacementError(f"{name} has version {body.get('version')!r}; this vcuda reads "
                             f"version {FORMAT_VERSION}: run one vcuda version in the cluster")
    return body


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
