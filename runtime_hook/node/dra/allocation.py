"""What a ResourceClaim's allocation gives this node's vcuda devices: a share of each GPU.

The scheduler writes ``status.allocation.devices.results``, one result per
allocated device with the ``consumedCapacity`` it charged (rounded up to the
device's request policy). A result for ``vcuda.io`` in this node's pool
becomes a :class:`Share`. A result without ``consumedCapacity`` (the
``DRAConsumableCapacity`` feature gate off) had the device to itself: the
whole GPU. All of a claim's vcuda shares must consume the same cores and
memory, because one limits file serves every container that uses the claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runtime_hook.contract import MEMORY_UNIT
from runtime_hook.hook_errors import NodeError
from runtime_hook.node.dra.slices import CORES, DRIVER
from runtime_hook.record import Record


class AllocationError(NodeError, ValueError):
    """The claim's allocation cannot be prepared here; the message says why."""

    fix = "delete the pod and its claim so that the scheduler allocates it again"


class Share(Record):
    """One allocated device: its result's request, device name, GPU UUID, cores and memory.

    ``whole``: the claim consumed all of the GPU, which vcuda then does not limit.
    """

    _fields = ("request", "device", "uuid", "cores", "memory", "whole")
    __slots__ = _fields
    request: str
    device: str
    uuid: str
    cores: int
    memory: int
    whole: bool


def claim_name(claim: Mapping[str, Any]) -> str:
    """``namespace/name`` of a claim object, for messages."""
    metadata = as_object(claim.get("metadata"))
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def shares(claim: Mapping[str, Any], pool: str,
           offered: Mapping[str, tuple[str, int]], cores: int = CORES) -> list[Share]:
    """The claim's shares of this node's GPUs.

    ``pool`` is this node's pool; ``offered`` maps each device name of its slice
    to (GPU UUID, memory capacity in bytes); ``cores`` is each device's cores
    capacity (above 100 with compute overcommit). Raise AllocationError when the
    allocation is missing, malformed, or names what this node does not offer.
    """
    allocation = as_object(claim.get("status")).get("allocation")
    if not allocation:
        raise AllocationError(f"claim {claim_name(claim)} has no allocation yet",
                              "wait: kubelet prepares a claim once it is allocated")
    results = as_object(as_object(allocation).get("devices")).get("results") or []
    if not isinstance(results, list) or not all(isinstance(r, Mapping) for r in results):
        raise AllocationError(f"claim {claim_name(claim)}: its allocation's results are not "
                              "a list of objects")
    found = [_share(result, pool, offered, cores, claim) for result in results
             if result.get("driver") == DRIVER]
    if len({(s.cores, s.memory) for s in found}) > 1:
        raise AllocationError(
            f"claim {claim_name(claim)} consumes different cores or memory on its vcuda "
            "devices, and one limits file serves the whole claim",
            "ask for one size per claim: a claim for each size")
    return found


def as_object(value: Any) -> Mapping[str, Any]:
    """``value`` when it is an object; an empty one when it is absent or not an object (the
    caller then finds the field it wants missing and says so)."""
    return value if isinstance(value, Mapping) else {}


def _share(result: Mapping[str, Any], pool: str, offered: Mapping[str, tuple[str, int]],
           offered_cores: int, claim: Mapping[str, Any]) -> Share:
    device = result.get("device", "")
    if result.get("pool") != pool:
        raise AllocationError(f"claim {claim_name(claim)}: device {device!s:.100} of pool "
                              f"{result.get('pool')!r:.100} is not on this node (pool {pool!r})")
    if not isinstance(device, str) or device not in offered:
        raise AllocationError(f"claim {claim_name(claim)}: device {device!r:.100} is not a GPU "
                              "of this node (removed since it was allocated?)")
    uuid, capacity = offered[device]
    consumed = result.get("consumedCapacity")
    request = str(result.get("request", ""))
    if consumed is None:
        return Share(request, device, uuid, CORES, capacity, True)
    if not isinstance(consumed, Mapping):
        raise AllocationError(f"claim {claim_name(claim)}: device {device}'s consumedCapacity "
                              "is not an object")
    cores = _amount(consumed, "cores", offered_cores, 1, offered_cores, claim)
    memory = _amount(consumed, "memory", capacity, MEMORY_UNIT, capacity, claim)
    if memory % MEMORY_UNIT:
        raise AllocationError(f"claim {claim_name(claim)}: memory {memory} is not a whole "
                              f"number of {MEMORY_UNIT >> 20} MiB")
    whole = cores == offered_cores and memory == capacity
    # Past 100 (compute overcommit) a claim is held to no share of the GPU's time.
    return Share(request, device, uuid, min(cores, CORES), memory, whole)


_MAX_QUANTITY = 64  # characters: more than any amount of a GPU takes to write


def _amount(consumed: Mapping[str, Any], key: str, default: int, low: int, high: int,
            claim: Mapping[str, Any]) -> int:
    """The consumed ``key`` in ``low..high``; checked in that range before it becomes an int,
    so that no value, however large its exponent, costs more than a comparison."""
    raw = consumed.get(key)
    if raw is None:
        return default
    wrong = AllocationError(f"claim {claim_name(claim)}: consumed {key} {raw!r:.80} is not a "
                            f"whole number in {low}..{high}")
    if isinstance(raw, bool) or not isinstance(raw, (str, int)) or len(str(raw)) > _MAX_QUANTITY:
        raise wrong
    from kubernetes.utils.quantity import parse_quantity  # the client's own parser

    try:
        value = parse_quantity(raw)
    except (ValueError, ArithmeticError):
        raise wrong from None
    if not value.is_finite() or not low <= value <= high or value != value.to_integral_value():
        raise wrong
    return int(value)
