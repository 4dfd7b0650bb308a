"""Per-GPU fit under DRA: the scheduler's consumable-capacity rules, replayed over vcuda's slices
for thousands of claims, never put more on a GPU than it has, and the node agrees with them."""

from __future__ import annotations

import random
import uuid
from fractions import Fraction

import pytest

from runtime_hook.contract import MEMORY_UNIT, Gpu, Sharing
from runtime_hook.limits_decision import Request, overcommit
from runtime_hook.node.dra.allocation import shares
from runtime_hook.node.dra.slices import GpuModel, device_name, memory_capacity, resource_slice
from tests.dra.scheduler import Allocator, consumed, violates
from tests.node.fake_pynvml import GIB

MIB = 1 << 20
MODELS = (("NVIDIA H100 80GB HBM3", 80 * GIB, (9, 0)), ("NVIDIA A100-SXM4-40GB", 40 * GIB, (8, 0)),
          ("NVIDIA L4", 23034 * MIB, (8, 9)), ("Tesla T4", 15360 * MIB, (7, 5)))


def _cluster(nodes: int, per_node: int) -> dict[str, list[GpuModel]]:
    found = {}
    for n in range(nodes):
        product, memory, capability = MODELS[n % len(MODELS)]
        found[f"node-{n}"] = [GpuModel(f"GPU-{uuid.UUID(int=n * 64 + i)}", i, memory, product,
                                       capability) for i in range(per_node)]
    return found


def _claim(cores: str | None, memory: str | None) -> dict:
    requests = {k: v for k, v in (("cores", cores), ("memory", memory)) if v is not None}
    exactly: dict = {"deviceClassName": "gpu.vcuda.io"}
    if requests:
        exactly["capacity"] = {"requests": requests}
    return {"metadata": {"namespace": "fit", "name": "c", "uid": str(uuid.uuid4())},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}


CORES = resource_slice("n", _cluster(1, 1)["node-0"], Sharing(), 1)["spec"]["devices"][0][
    "capacity"]


@pytest.mark.parametrize(("requested", "expected"), [
    (None, 100), ("30", 30), ("1", 1), ("100", 100), ("0", 1), ("29.5", 30)])
def test_cores_are_consumed_in_whole_percent_and_default_to_the_whole_gpu(
        requested: str | None, expected: int) -> None:
    assert consumed(CORES["cores"], requested) == expected


@pytest.mark.parametrize(("requested", "expected"), [
    (None, 80 * GIB), ("10Gi", 10 * GIB), ("1000Mi", 1024 * MIB), ("100Mi", 256 * MIB),
    ("1G", 1024 * MIB), ("80Gi", 80 * GIB)])
def test_memory_is_rounded_up_to_256_mib_and_defaults_to_the_whole_gpu(
        requested: str | None, expected: int) -> None:
    assert consumed(CORES["memory"], requested) == expected


def test_more_than_a_gpu_has_breaks_the_policy_and_fits_nowhere() -> None:
    assert violates(CORES["cores"], Fraction(101))
    assert violates(CORES["memory"], consumed(CORES["memory"], "81Gi"))
    allocator = Allocator([resource_slice("n", _cluster(1, 2)["node-0"], Sharing(), 1)])
    assert not allocator.allocate(_claim("150", "1Gi"))
    assert not allocator.allocate(_claim("10", "81Gi"))


def test_thousands_of_claims_never_overfill_a_gpu_and_the_node_ledger_agrees() -> None:
    cluster = _cluster(nodes=4, per_node=4)
    allocator = Allocator(resource_slice(node, gpus, Sharing(), 1)
                          for node, gpus in cluster.items())
    inventory = {node: {g.uuid: Gpu(g.uuid, g.index, g.memory) for g in gpus}
                 for node, gpus in cluster.items()}
    offered = {node: {device_name(g.uuid): (g.uuid, memory_capacity(g.memory, Sharing()))
                      for g in gpus} for node, gpus in cluster.items()}
    memory = {g.uuid: 0 for gpus in cluster.values() for g in gpus}
    cores = dict.fromkeys(memory, 0)
    rng = random.Random(5075)
    live: list[tuple[dict, str, int, int]] = []
    placed = refused = 0
    for _ in range(4000):
        if live and rng.random() < 0.4:  # a pod ends: its claim is deallocated
            claim, gpu, mem, cpu = live.pop(rng.randrange(len(live)))
            allocator.release(claim)
            memory[gpu] -= mem
            cores[gpu] -= cpu
            continue
        whole = rng.random() < 0.03
        want_cores = None if whole else rng.randint(1, 99)
        want_memory = None if whole else rng.randint(1, 24 * 1024) * MIB
        claim = _claim(None if whole else str(want_cores),
                       None if whole else rng.choice([f"{want_memory // MIB}Mi",
                                                      str(want_memory)]))
        if not allocator.allocate(claim):
            refused += 1
            # Refused only when no GPU has room for the rounded-up request.
            need_memory = -(-(want_memory or 0) // MEMORY_UNIT) * MEMORY_UNIT
            for node, devices in offered.items():
                for gpu, capacity in devices.values():
                    room = (cores[gpu] + (want_cores or 100) <= 100
                            and memory[gpu] + (need_memory or capacity) <= capacity)
                    if room and not whole:
                        raise AssertionError(f"{node} {gpu} had room: {claim}")
                    if whole:
                        assert cores[gpu] or memory[gpu], f"{gpu} was free for a whole GPU"
            continue
        [result] = claim["status"]["allocation"]["devices"]["results"]
        node = result["pool"]
        [share] = shares(claim, node, offered[node])  # as the node's plugin reads it
        capacity = offered[node][share.device][1]
        if whole:
            assert share.whole and (share.cores, share.memory) == (100, capacity)
        else:
            assert share.cores == want_cores
            assert want_memory <= share.memory < want_memory + MEMORY_UNIT
            assert share.memory % MEMORY_UNIT == 0
        # The node ledger's check, given what the node committed, accepts every placement.
        committed = {gpu: (memory[gpu], cores[gpu]) for gpu in memory}
        request = Request(container="c", cores=share.cores, memory=share.memory)
        assert overcommit(request, (share.uuid,), committed, inventory[node], Sharing()) is None
        memory[share.uuid] += share.memory
        cores[share.uuid] += share.cores
        assert memory[share.uuid] <= capacity and cores[share.uuid] <= 100
        live.append((claim, share.uuid, share.memory, share.cores))
        placed += 1
    assert placed > 1500 and refused > 100, (placed, refused)
    for (_, pool, name), used in allocator.used.items():
        uuid_, capacity = offered[pool][name]
        assert used.get("memory", 0) == memory[uuid_] <= capacity
        assert used.get("cores", 0) == cores[uuid_] <= 100


def test_with_cores_scaling_two_claims_at_60_share_a_gpu_and_a_third_does_not_fit() -> None:
    sharing = Sharing(cores_scaling=1.2)
    allocator = Allocator([resource_slice("n", _cluster(1, 1)["node-0"], sharing, 1)])
    assert allocator.allocate(_claim("60", "1Gi"))
    assert allocator.allocate(_claim("60", "1Gi"))
    assert not allocator.allocate(_claim("1", "1Gi"))


def test_with_max_sharers_each_claim_takes_one_sharer_and_the_next_fits_nowhere() -> None:
    sharing = Sharing(max_sharers=3)
    allocator = Allocator([resource_slice("n", _cluster(1, 1)["node-0"], sharing, 1)])
    claims = [_claim("10", "1Gi") for _ in range(3)]
    assert all(allocator.allocate(claim) for claim in claims)
    assert claims[0]["status"]["allocation"]["devices"]["results"][0][
        "consumedCapacity"]["sharers"] == "1"
    assert not allocator.allocate(_claim("10", "1Gi"))
    allocator.release(claims[0])
    assert allocator.allocate(_claim("10", "1Gi"))


def test_a_claim_past_100_cores_under_overcommit_is_held_to_no_share_and_the_whole_is_whole(
) -> None:
    [gpu] = _cluster(1, 1)["node-0"]
    sharing = Sharing(cores_scaling=1.5)
    allocator = Allocator([resource_slice("n", [gpu], sharing, 1)])
    offered = {device_name(gpu.uuid): (gpu.uuid, memory_capacity(gpu.memory, sharing))}
    large, whole = _claim("120", "1Gi"), _claim(None, None)
    assert allocator.allocate(large)
    [share] = shares(large, "n", offered, sharing.cores())
    assert (share.cores, share.whole) == (100, False)
    allocator.release(large)
    assert allocator.allocate(whole)
    [share] = shares(whole, "n", offered, sharing.cores())
    assert (share.cores, share.whole) == (100, True)
