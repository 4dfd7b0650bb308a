"""Offline checks of a placement's end state, for scripts/bench-scheduling: from the objects
alone (pods and their assignments or claims, nodes, slices), with no code of the extender's or
the scheduler's, how many GPUs are given out beyond their memory or time, are shared and whole
at once, and how many pods wait although a GPU could hold them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from runtime_hook.contract import ASSIGNMENT_ANNOTATION, CORES_PER_GPU
from runtime_hook.placement import PlacementError, decode_assignment, decode_inventory
from tests.cluster.simulated import Pod
from tests.extender.cluster import GIB
from webhook.quantity import parse_whole_quantity


class Gpus:
    """What each GPU has given out: cores, bytes, shares and whole holders, by GPU."""

    def __init__(self, capacity: dict[str, tuple[str, int, int]]) -> None:
        """``capacity``: by GPU, (its node, cores, bytes)."""
        self.capacity = capacity
        self.cores: dict[str, int] = defaultdict(int)
        self.memory: dict[str, int] = defaultdict(int)
        self.shared: dict[str, int] = defaultdict(int)
        self.whole: dict[str, int] = defaultdict(int)

    def add_share(self, gpu: str, cores: int, memory: int) -> None:
        self.cores[gpu] += cores
        self.memory[gpu] += memory
        self.shared[gpu] += 1

    def add_whole(self, gpu: str) -> None:
        self.whole[gpu] += 1

    def findings(self, pending: Iterable[Pod]) -> dict[str, int]:
        over = sum(1 for g, (_, cores, memory) in self.capacity.items()
                   if self.cores[g] > cores or self.memory[g] > memory)
        both = sum(1 for g in self.capacity if self.whole[g] and (self.shared[g] or
                                                                  self.whole[g] > 1))
        return {"over_committed_gpus": over, "shared_and_whole_gpus": both,
                "pending_with_room": sum(1 for pod in pending if self.room_for(pod))}

    def room_for(self, pod: Pod) -> bool:
        """Whether some GPU (a node's free GPUs, for whole ones) could hold ``pod`` now."""
        free_by_node: dict[str, int] = defaultdict(int)
        for gpu, (node, cores, memory) in self.capacity.items():
            used = self.shared[gpu] or self.whole[gpu]
            if pod.whole:
                free_by_node[node] += not used
            elif not self.whole[gpu] and self.cores[gpu] + pod.cores <= cores \
                    and self.memory[gpu] + pod.gib * GIB <= memory:
                return True
        return any(free >= pod.whole for free in free_by_node.values()) if pod.whole else False


def by_assignments(nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                   asks: dict[str, Pod]) -> dict[str, int]:
    """The per-GPU placement path: each bound pod's ``vcuda.io/assigned-gpus`` against its
    node's published inventory."""
    capacity = {}
    for node in nodes:
        metadata = node["metadata"]
        inventory = decode_inventory(metadata["annotations"]["vcuda.io/gpus"])
        for published in inventory.gpus:
            capacity[published.uuid] = (metadata["name"], published.cores, published.memory)
    gpus = Gpus(capacity)
    unassigned = 0
    for pod in _live(pods):
        if not pod["spec"].get("nodeName"):
            continue
        try:
            assignment = decode_assignment(
                (pod["metadata"].get("annotations") or {})[ASSIGNMENT_ANNOTATION])
        except (KeyError, PlacementError):
            unassigned += 1
            continue
        if assignment.shared:
            for gpu in assignment.shared_gpus():
                gpus.add_share(gpu, assignment.shared[1], assignment.shared[2])
        for gpu in assignment.whole:
            gpus.add_whole(gpu)
    return {**gpus.findings(_pending(pods, asks)), "bound_without_assignment": unassigned}


def by_claims(slices: list[dict[str, Any]], claims: list[dict[str, Any]],
              pods: list[dict[str, Any]], asks: dict[str, Pod]) -> dict[str, int]:
    """The DRA path: each allocated claim's consumed capacity against its device's."""
    capacity, whole_memory = {}, {}
    for piece in slices:
        node = piece["spec"]["nodeName"]
        for device in piece["spec"]["devices"]:
            key = f"{node}/{device['name']}"
            memory = parse_whole_quantity(device["capacity"]["memory"]["value"])
            capacity[key] = (node, parse_whole_quantity(device["capacity"]["cores"]["value"]),
                             memory)
            whole_memory[key] = memory
    gpus = Gpus(capacity)
    for claim in claims:
        if (claim.get("metadata") or {}).get("deletionTimestamp"):
            continue
        allocation = (claim.get("status") or {}).get("allocation")
        for result in ((allocation or {}).get("devices") or {}).get("results") or []:
            key = f"{result['pool']}/{result['device']}"
            consumed = result.get("consumedCapacity") or {}
            cores = parse_whole_quantity(consumed.get("cores", CORES_PER_GPU))
            memory = parse_whole_quantity(consumed.get("memory", whole_memory[key]))
            if cores >= capacity[key][1] and memory >= whole_memory[key]:
                gpus.add_whole(key)
            else:
                gpus.add_share(key, cores, memory)
    return gpus.findings(_pending(pods, asks))


def _live(pods: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    return (p for p in pods if not p["metadata"].get("deletionTimestamp"))


def _pending(pods: list[dict[str, Any]], asks: dict[str, Pod]) -> list[Pod]:
    return [asks[p["metadata"]["name"]] for p in _live(pods) if not p["spec"].get("nodeName")]
