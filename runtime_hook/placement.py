"""What per-GPU placement writes into the cluster: the node's GPU inventory, its GPU ledger, a
pod's assignment, and the device-plugin resources that carry the assignment to the node.

Three annotations, all JSON, all written by vcuda only:

- ``vcuda.io/gpus`` on a Node, by the node agent: the GPUs it found and a heartbeat::

      {"version": 1, "heartbeat": 1767225600,
       "gpus": [{"uuid": "GPU-5c3d...", "index": 0, "memory": 85899345920}, ...]}

  ``memory`` is what shared containers may commit on that GPU (its total times the
  agent's memory scaling); ``cores``, written only when it is not 100, the percent of
  its time their shares may add up to (100 times the cores scaling); ``sharers``,
  written only with a cap, the most shared containers it takes. A heartbeat older than
  the extender's limit makes the node unschedulable for vcuda pods.
- ``vcuda.io/gpu-ledger`` on a Node, by the scheduler extender at bind (each write
  conditional on the Node's resourceVersion) and pruned by the node agent when pods end::

      {"version": 1, "pods": {"<pod uid>": {"pod": "ns/name", "at": 1767225600,
                                            "shared": ["GPU-...", 30, 10737418240],
                                            "whole": ["GPU-...", ...]}}}

  A share of several GPUs (a container's ``"gpus": N`` in ``vcuda.io/limits``) adds
  ``"also_shared": ["GPU-...", ...]``: the N-1 further GPUs that each carry the same cores
  and bytes as the first. An entry without it is a share of one GPU, as before.

  It is the truth of what each GPU has given out: two binds on one node cannot both
  succeed against the same version of it.
- ``vcuda.io/assigned-gpus`` on a Pod, written with its Binding: the same ``shared`` and
  ``whole`` fields, for the node side and for people to read.

Each reader holds them to bounds, since a node's own agent writes two of them and one broken
or hostile node must not cost every reader (the scheduler extender reads all nodes): at most
:data:`MAX_INVENTORY_CHARS` characters and :data:`MAX_GPUS` GPUs in an inventory,
:data:`MAX_LEDGER_CHARS` in a ledger (the API server's limit for all of an object's
annotations), UUIDs of 1..:data:`MAX_UUID_CHARS` printable ASCII characters, GPU memory and a
share's bytes at most :data:`~runtime_hook.contract.MAX_GPU_MEMORY`, shared cores in
``SHARE_MIN..SHARE_MAX``, a GPU's cores in 100..1000 and its sharers in
0..:data:`~runtime_hook.contract.MAX_SHARERS`, indices below :data:`MAX_GPUS`, times
(``heartbeat``, ``at``) below :data:`MAX_SECONDS`. Anything else is malformed: the value is
refused whole, with its reason.

Standard library only: the OCI hook may import it.
"""

from __future__ import annotations

import json

from runtime_hook.contract import (
    ASSIGNMENT_ANNOTATION,
    CORES_PER_GPU,
    CORES_SCALING_MAX,
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    MAX_GPU_MEMORY,
    MAX_SHARERS,
    SHARE_MAX,
    SHARE_MIN,
    ContractError,
    Gpu,
)
from runtime_hook.record import Record

TYPE_CHECKING = False  # typing's, without importing typing (the hook's start-up cost)
if TYPE_CHECKING:
    from collections.abc import Mapping

FORMAT_VERSION = 1
# A node has at most 16 GPUs today; in MIG mode each is listed with its (up to 7) devices.
MAX_GPUS = 256
MAX_UUID_CHARS = 128  # NVIDIA's are 40 ("GPU-" and a UUID), MIG's older form about 50
MAX_INVENTORY_CHARS = 64 << 10  # MAX_GPUS entries of the longest UUIDs fit
MAX_LEDGER_CHARS = 256 << 10  # the API server's limit for all of an object's annotations
MAX_ASSIGNMENT_CHARS = 64 << 10
MAX_POD_CHARS = 317  # a namespace (63), "/" and a pod name (253)
MAX_SECONDS = 1 << 40  # Unix seconds: the year 36812
_MAX_CORES = round(CORES_PER_GPU * CORES_SCALING_MAX)


class PlacementError(ContractError):
    """An annotation cannot be read; the message names it and says why."""


class Inventory(Record):
    """A node's GPUs as its agent published them, and when (Unix seconds)."""

    _fields = ("gpus", "heartbeat")
    __slots__ = _fields
    gpus: tuple[Gpu, ...]
    heartbeat: int


class Assignment(Record):
    """The GPUs one pod got: ``shared`` is (uuid, cores, memory bytes) or None; ``whole`` UUIDs;
    ``also_shared`` the further GPUs that each carry the same share as ``shared``'s."""

    _fields = ("shared", "whole", "also_shared")
    __slots__ = _fields
    _defaults = ((),)
    shared: tuple[str, int, int] | None
    whole: tuple[str, ...]
    also_shared: tuple[str, ...]

    def shared_gpus(self) -> tuple[str, ...]:
        """The UUIDs of the GPUs the pod's share is on, the first GPU first."""
        return (self.shared[0], *self.also_shared) if self.shared else ()

    def gpus(self) -> tuple[str, ...]:
        """Every GPU UUID the pod uses."""
        return self.shared_gpus() + tuple(self.whole)

    def to_json(self) -> dict:
        body: dict = {}
        if self.shared:
            body["shared"] = list(self.shared)
            if self.also_shared:
                body["also_shared"] = list(self.also_shared)
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
                       "gpus": [_gpu_json(g) for g in sorted(gpus, key=lambda g: g.index)]},
                      separators=(",", ":"))


def _gpu_json(gpu: Gpu) -> dict:
    body: dict = {"uuid": gpu.uuid, "index": gpu.index, "memory": gpu.memory}
    if gpu.cores != CORES_PER_GPU:
        body["cores"] = gpu.cores
    if gpu.sharers:
        body["sharers"] = gpu.sharers
    return body


def decode_inventory(text: str) -> Inventory:
    """Read :data:`INVENTORY_ANNOTATION`; raise PlacementError naming what is wrong. Linear in
    the text's length, which is bounded."""
    body = _object(text, INVENTORY_ANNOTATION, MAX_INVENTORY_CHARS)
    try:
        heartbeat = _bounded(body["heartbeat"], 0, MAX_SECONDS, "heartbeat")
        items = body["gpus"]
        if not isinstance(items, list) or len(items) > MAX_GPUS:
            raise ValueError(f"gpus is not a list of at most {MAX_GPUS} GPUs")
        gpus: list[Gpu] = []
        seen: set[str] = set()
        for item in items:
            if not isinstance(item, dict):
                raise ValueError(f"GPU {_shown(item)} is not an object")
            uuid = _uuid(item["uuid"])
            if uuid in seen:  # what is given out is counted by UUID
                raise ValueError(f"GPU {uuid} is listed twice")
            seen.add(uuid)
            gpus.append(Gpu(uuid, _bounded(item["index"], 0, MAX_GPUS - 1, "index"),
                            _bounded(item["memory"], 0, MAX_GPU_MEMORY, "memory"),
                            _bounded(item.get("cores", CORES_PER_GPU), CORES_PER_GPU,
                                     _MAX_CORES, "cores"),
                            _bounded(item.get("sharers", 0), 0, MAX_SHARERS, "sharers")))
    except KeyError as exc:
        raise PlacementError(f"{INVENTORY_ANNOTATION} is malformed: {exc} is missing") from None
    except ValueError as exc:
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
    body = _object(text, LEDGER_ANNOTATION, MAX_LEDGER_CHARS)
    try:
        pods = body["pods"]
        if not isinstance(pods, dict):
            raise ValueError("pods is not an object")
        entries = {}
        for uid, item in pods.items():
            if not isinstance(item, dict) or not _printable(uid, MAX_UUID_CHARS):
                raise ValueError(f"the entry of {_shown(uid)} is not an object of a pod uid")
            pod = item["pod"]
            if not isinstance(pod, str) or not _printable(pod, MAX_POD_CHARS):
                raise ValueError(f"pod {_shown(pod)} of {_shown(uid)} is not a pod's name")
            entries[uid] = Entry(pod, _bounded(item["at"], 0, MAX_SECONDS, "at"),
                                 assignment_from(item))
    except KeyError as exc:
        raise PlacementError(f"{LEDGER_ANNOTATION} is malformed: {exc} is missing") from None
    except ValueError as exc:
        raise PlacementError(f"{LEDGER_ANNOTATION} is malformed: {exc}") from None
    return entries


def encode_assignment(assignment: Assignment) -> str:
    """The value of :data:`ASSIGNMENT_ANNOTATION`."""
    return json.dumps(assignment.to_json(), separators=(",", ":"))


def decode_assignment(text: str) -> Assignment:
    """Read :data:`ASSIGNMENT_ANNOTATION`; raise PlacementError naming what is wrong."""
    body = _object(text, ASSIGNMENT_ANNOTATION, MAX_ASSIGNMENT_CHARS)
    try:
        return assignment_from(body)
    except ValueError as exc:
        raise PlacementError(f"{ASSIGNMENT_ANNOTATION} is malformed: {exc}") from None


def assignment_from(body: dict) -> Assignment:
    """The ``shared``, ``also_shared`` and ``whole`` fields of a ledger entry or an assignment;
    raise ValueError naming what is wrong."""
    shared = body.get("shared")
    if shared is not None:
        if not isinstance(shared, list) or len(shared) != 3:
            raise ValueError(f"shared {_shown(shared)} is not [uuid, cores, bytes]")
        shared = (_uuid(shared[0]), _bounded(shared[1], SHARE_MIN, SHARE_MAX, "shared cores"),
                  _bounded(shared[2], 1, MAX_GPU_MEMORY, "shared bytes"))
    whole = body.get("whole") or []
    if not isinstance(whole, list) or len(whole) > MAX_GPUS:
        raise ValueError(f"whole is not a list of at most {MAX_GPUS} UUIDs")
    also = body.get("also_shared") or []
    if not isinstance(also, list) or len(also) >= MAX_GPUS or (also and shared is None):
        raise ValueError(f"also_shared is not a list of fewer than {MAX_GPUS} UUIDs beside "
                         "a shared GPU")
    also_shared = tuple(_uuid(uuid) for uuid in also)
    if shared and len(set(also_shared) | {shared[0]}) != len(also_shared) + 1:
        raise ValueError("a GPU of the share is listed twice")
    return Assignment(shared, tuple(_uuid(uuid) for uuid in whole), also_shared)


def _object(text: str, name: str, limit: int) -> dict:
    if not isinstance(text, str):
        raise PlacementError(f"{name} is not a string")
    if len(text) > limit:
        raise PlacementError(f"{name} has {len(text)} characters, more than the {limit} "
                             "allowed")
    try:
        body = json.loads(text)
    except ValueError as exc:  # digits past Python's limit for int() too
        raise PlacementError(f"{name} is not JSON: {_cut(str(exc))}") from None
    except RecursionError:
        raise PlacementError(f"{name} is nested too deep to be read") from None
    if not isinstance(body, dict):
        raise PlacementError(f"{name} is not a JSON object")
    if body.get("version", FORMAT_VERSION) != FORMAT_VERSION:
        raise PlacementError(f"{name} has version {_shown(body.get('version'))}; this vcuda "
                             f"reads version {FORMAT_VERSION}: run one vcuda version in the "
                             "cluster")
    return body


def _bounded(value: object, low: int, high: int, what: str) -> int:
    """``value`` if it is a whole number in low..high (not a bool); ValueError otherwise."""
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} {_shown(value)} is not a whole number in {low}..{high}")
    return value


def _uuid(value: object) -> str:
    """``value`` if it is a GPU UUID: 1..MAX_UUID_CHARS printable ASCII characters, no space."""
    if not (isinstance(value, str) and value and _printable(value, MAX_UUID_CHARS)):
        raise ValueError(f"UUID {_shown(value)} is not 1..{MAX_UUID_CHARS} printable ASCII "
                         "characters")
    return value


def _printable(text: str, limit: int) -> bool:
    """Whether ``text`` has at most ``limit`` printable ASCII characters and no space: what
    Kubernetes allows in names and uids, and what NVIDIA writes in UUIDs."""
    return len(text) <= limit and text.isascii() and text.isprintable() and " " not in text


def _shown(value: object) -> str:
    """``value`` as a message may quote it: its repr, cut short (values are the nodes')."""
    if isinstance(value, int) and value.bit_length() >= 64:  # repr() refuses 4,300 digits
        return f"a number of {value.bit_length()} bits"
    return _cut(repr(value))


def _cut(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:77]}..."
