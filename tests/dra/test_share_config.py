"""A claim's config for driver vcuda.io: virtual device memory asked for in its opaque
parameters, and each parameter vcuda cannot read refused with what to write instead."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from runtime_hook import contract
from runtime_hook.apply_limits import LIMITS_FILE
from runtime_hook.contract import Sharing, parse_limits
from runtime_hook.node.dra.allocation import AllocationError
from runtime_hook.node.dra.prepare import RECORD_PREFIX, Paths, Preparer
from runtime_hook.node.dra.share_config import virtual_memory_asked
from runtime_hook.node.dra.slices import DRIVER, device_name
from runtime_hook.node_state import StateDir
from tests.dra.conftest import GPU0, unmount_below

UID = "0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e"
ASKED = {"apiVersion": "vcuda.io/v1alpha1", "kind": "ShareConfig", "virtualMemory": True}
FIX = ('write them as {"apiVersion": "vcuda.io/v1alpha1", "kind": "ShareConfig", '
       '"virtualMemory": true} (docs/DRA.md, "Virtual device memory")')


def _claim(*configs: dict[str, Any], memory: str = "4Gi") -> dict[str, Any]:
    """A claim for one share of GPU0, allocated with ``configs`` as the scheduler copies them."""
    result = {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": device_name(GPU0),
              "consumedCapacity": {"cores": "30", "memory": memory}}
    return {"metadata": {"namespace": "team-a", "name": "serve", "uid": UID},
            "status": {"allocation": {"devices": {"results": [result],
                                                  "config": list(configs)}}}}


def _config(parameters: Any, driver: str = DRIVER, requests: list[str] | None = None,
            ) -> dict[str, Any]:
    config: dict[str, Any] = {"source": "FromClaim",
                              "opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        config["requests"] = requests
    return config


@pytest.mark.parametrize(("configs", "asked"), [
    ([], False),
    ([_config(ASKED)], True),
    ([_config({**ASKED, "virtualMemory": False})], False),
    ([_config({"apiVersion": "vcuda.io/v1alpha1", "kind": "ShareConfig"})], False),
    ([_config(ASKED, driver="gpu.nvidia.com")], False),  # another driver's: not read
    ([_config(ASKED, requests=["other"])], False),        # for another request
    ([_config(ASKED, requests=["gpu"])], True),
    ([_config(ASKED), _config({**ASKED, "virtualMemory": False})], False),  # the last decides
], ids=["none", "asked", "false", "left-out", "other-driver", "other-request", "its-request",
        "last-decides"])
def test_the_claims_config_for_vcuda_says_whether_it_wants_virtual_memory(
        configs: list[dict[str, Any]], asked: bool) -> None:
    assert virtual_memory_asked(_claim(*configs), ["gpu"]) is asked


@pytest.mark.parametrize(("parameters", "message"), [
    ("virtual", "are not an object"),
    ({"apiVersion": "v1", "kind": "ShareConfig", "virtualMemory": True},
     "are apiVersion 'v1', kind 'ShareConfig'; vcuda reads vcuda.io/v1alpha1 ShareConfig"),
    ({**ASKED, "memory": "80Gi", "cores": 100},
     "have no cores, memory: they take virtualMemory"),
    ({**ASKED, "virtualMemory": "yes"}, ": virtualMemory must be true or false, got 'yes'"),
], ids=["not-an-object", "other-kind", "unknown-keys", "not-a-bool"])
def test_parameters_vcuda_cannot_read_are_refused_with_what_to_write(
        parameters: Any, message: str) -> None:
    with pytest.raises(AllocationError) as refused:
        virtual_memory_asked(_claim(_config(parameters)), ["gpu"])
    assert str(refused.value) == \
        f"claim team-a/serve: the parameters of driver vcuda.io {message}".replace(" :", ":")
    assert refused.value.fix == FIX


def _prepared_limits(tmp_path: Path, sharing: Sharing, claim: dict[str, Any],
                     log: logging.Logger) -> contract.Limits:
    if os.geteuid() != 0:
        pytest.skip("preparing a claim mounts its account tmpfs: needs root")
    state = tmp_path / "state"
    state.mkdir()
    contract.write_inventory(str(state / contract.INVENTORY_NAME),
                             [contract.Gpu(GPU0, 0, 16 << 30)])
    paths = Paths("/", str(state), str(tmp_path / "cdi"), "/usr/local/vcuda/lib/libvcuda.so", 1)
    preparer = Preparer(paths, pool="node-1", sharing=sharing, log=log)
    try:
        preparer.prepare(UID, claim)
        record = StateDir(str(state)).container_dir(RECORD_PREFIX + UID)
        return parse_limits(Path(record, LIMITS_FILE).read_text())
    finally:
        preparer.unprepare(UID)
        unmount_below(tmp_path)


def test_a_claim_asking_for_virtual_memory_on_a_scaling_node_gets_its_host_part(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("vcuda-node")
    with caplog.at_level(logging.INFO, logger="vcuda-node"):
        limits = _prepared_limits(tmp_path, Sharing(memory_scaling=2.0), _claim(_config(ASKED)),
                                  log)
    assert (limits.memory, limits.virtual_memory) == (4 << 30, 2 << 30)  # the hook's split
    [said] = [r for r in caplog.records if r.getMessage() == "claim_virtual_memory"]
    assert said.fields == {  # type: ignore[attr-defined]
        "claim": "team-a/serve", "memory": 4 << 30, "in_host_at_most": 2 << 30}


def test_a_claim_without_the_config_gets_device_memory_alone(tmp_path: Path) -> None:
    limits = _prepared_limits(tmp_path, Sharing(memory_scaling=2.0), _claim(),
                              logging.getLogger("vcuda-node"))
    assert (limits.memory, limits.virtual_memory) == (4 << 30, 0)


def test_virtual_memory_on_a_node_that_does_not_scale_memory_is_device_memory_and_said(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("vcuda-node")
    with caplog.at_level(logging.WARNING, logger="vcuda-node"):
        limits = _prepared_limits(tmp_path, Sharing(), _claim(_config(ASKED)), log)
    assert (limits.memory, limits.virtual_memory) == (4 << 30, 0)
    [said] = [r for r in caplog.records if r.getMessage() == "claim_virtual_memory_refused"]
    assert said.fields == {  # type: ignore[attr-defined]  # the agent's event fields
        "claim": "team-a/serve",
        "reason": "the claim asks for virtual memory, but this node does not scale memory "
                  "(--memory-scaling 1): all of its memory is device memory"}
