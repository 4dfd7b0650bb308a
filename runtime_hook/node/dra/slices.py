"""The ResourceSlice that offers this node's GPUs to the scheduler as consumable devices.

One slice per node, one pool named after the node. Each GPU is a device
``gpu-<uuid, lower case, no prefix>`` (stable across reboots, unlike the
index) that may be allocated to many claims at once
(``allowMultipleAllocations``), each consuming part of two capacities:

- ``cores``: 100 times the cores scaling, percent of the GPU's time, in steps
  of 1 from 1;
- ``memory``: the GPU's memory times the memory scaling, rounded down to
  256 MiB, in bytes, in steps of 256 MiB from 256 MiB;
- ``sharers``, only with a cap on sharers per GPU: the cap; every claim
  consumes 1 of it, whatever it asks for.

A request that leaves a capacity out consumes all of it (``requestPolicy.default``
is the whole capacity): a claim that names neither gets the whole GPU, and
vcuda does not limit it. Attributes: ``uuid``, ``index``, ``productName``,
``cudaComputeCapability`` (a version, e.g. 9.0.0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from runtime_hook.contract import CORES_PER_GPU, MEMORY_UNIT, Sharing
from runtime_hook.record import Record

DRIVER = "vcuda.io"
API_VERSION = "resource.k8s.io/v1"
CORES = CORES_PER_GPU
_MAX_NAME = 253


class GpuModel(Record):
    """One GPU as the slice shows it: UUID, index, memory in bytes, product, compute capability."""

    _fields = ("uuid", "index", "memory", "product", "compute_capability")
    __slots__ = _fields
    uuid: str
    index: int
    memory: int
    product: str
    compute_capability: tuple[int, int]


def device_name(uuid: str) -> str:
    """The device name of the GPU ``uuid``: a DNS label that does not change with its index."""
    body = uuid.lower()
    for prefix in ("gpu-", "mig-"):
        if body.startswith(prefix):
            body = f"{prefix[:3]}-{body[len(prefix):]}"
            break
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in body).strip("-")
    return name if name.startswith(("gpu-", "mig-")) else f"gpu-{name}"


def memory_capacity(memory: int, sharing: Sharing) -> int:
    """Bytes of ``memory`` a GPU offers to claims: scaled, down to whole 256 MiB."""
    return sharing.memory(memory) // MEMORY_UNIT * MEMORY_UNIT


def slice_name(node: str) -> str:
    """The name of ``node``'s slice (a DNS subdomain, as long node names are cut and hashed)."""
    name = f"{node}-{DRIVER}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[: _MAX_NAME - len(DRIVER) - 12]}-{digest}-{DRIVER}"


def devices(gpus: Iterable[GpuModel], sharing: Sharing) -> list[dict[str, Any]]:
    """The slice's devices for ``gpus``, sorted by index."""
    found = []
    capacity = {"cores": _capacity(sharing.cores(), 1, 1)}
    if sharing.max_sharers:
        capacity["sharers"] = {"value": str(sharing.max_sharers),
                               "requestPolicy": {"default": "1", "validValues": ["1"]}}
    for gpu in sorted(gpus, key=lambda g: g.index):
        memory = memory_capacity(gpu.memory, sharing)
        if memory < MEMORY_UNIT:
            continue  # nothing a claim could consume
        major, minor = gpu.compute_capability
        found.append({
            "name": device_name(gpu.uuid),
            "allowMultipleAllocations": True,
            "attributes": {
                "uuid": {"string": gpu.uuid},
                "index": {"int": gpu.index},
                "productName": {"string": gpu.product},
                "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
            },
            "capacity": {
                **capacity,
                "memory": _capacity(memory, MEMORY_UNIT, MEMORY_UNIT, binary=True),
            },
        })
    return found


def resource_slice(node: str, gpus: Iterable[GpuModel], sharing: Sharing, generation: int,
                   node_uid: str | None = None) -> dict[str, Any]:
    """``node``'s whole ResourceSlice object, its pool at ``generation``.

    With ``node_uid`` the Node owns the slice: deleting the node deletes it.
    """
    metadata: dict[str, Any] = {"name": slice_name(node),
                                "labels": {"app.kubernetes.io/part-of": "vcuda"}}
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node,
                                        "uid": node_uid, "controller": True}]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices(gpus, sharing),
        },
    }


def quantity(amount: int, binary: bool = False) -> str:
    """``amount`` as the API server writes a quantity back: binary ones with the largest
    suffix that divides them (``81920Mi`` is ``80Gi``)."""
    if binary:
        for power, suffix in ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki")):
            if amount and amount % (1024**power) == 0:
                return f"{amount // 1024**power}{suffix}"
    return str(amount)


def _capacity(value: int, low: int, step: int, binary: bool = False) -> dict[str, Any]:
    def q(amount: int) -> str:
        return quantity(amount, binary)

    return {"value": q(value), "requestPolicy": {
        "default": q(value),
        "validRange": {"min": q(low), "max": q(value), "step": q(step)},
    }}
