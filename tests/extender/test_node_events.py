"""The extender's Warning Events on the nodes it leaves out whatever the pod: one Event per
node and cause however many pods meet it, its series counted, nothing on a node that is not
vcuda's, and a refused Event costs a log line, never the scheduler's answer."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from extender.node_events import CONTROLLER
from runtime_hook.contract import ENABLED_LABEL, INVENTORY_ANNOTATION
from tests.extender.cluster import (
    GIB,
    NOW,
    ROOT,
    RunningExtender,
    add,
    filtered,
    node_object,
    pod_object,
)
from tests.extender.test_nodes import EXTENDER_ACCOUNT
from tests.fake_cluster_api import FakeClusterApi
from tests.fake_kube_api import Rule, rules_from_manifests
from tests.json_log import written_entries

RBAC = ROOT / "manifests" / "placement" / "component" / "extender-rbac.yaml"
STALE_NOTE = ("the vcuda node agent has not published this node's GPUs for over 120 s, so no "
              "vcuda pod is placed here: check its vcuda-node pod")


def _written(api: FakeClusterApi, count: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The Events stored once there are ``count`` of them (they are written in the
    background)."""
    deadline = time.monotonic() + timeout
    while len(stored := api.events()) < count:
        assert time.monotonic() < deadline, f"{len(stored)} Events, not {count}: {stored}"
        time.sleep(0.01)
    return stored


def _shipped_rules() -> list[Rule]:
    return rules_from_manifests(list(yaml.safe_load_all(RBAC.read_text())), EXTENDER_ACCOUNT)


def _pods(api: FakeClusterApi, count: int) -> list[dict[str, Any]]:
    return add(api, *(pod_object(f"p{n}", 10, 1) for n in range(count)))


def test_a_stale_node_gets_one_warning_for_every_pod_it_was_left_out_of(
        api: FakeClusterApi, tmp_path: Path) -> None:
    add(api, node_object("stale", [16 * GIB], heartbeat=NOW - 600),
        node_object("fresh", [16 * GIB]))
    extender = RunningExtender(api, tmp_path / "extender.log", events_interval=0.2)
    try:
        for pod in _pods(api, 3):
            assert filtered(extender, api, pod, ["stale", "fresh"])["NodeNames"] == ["fresh"]
        [stored] = _written(api)
        assert (stored["type"], stored["reason"], stored["action"], stored["note"]) == (
            "Warning", "GPUInventoryStale", "LeaveOutOfPlacement", STALE_NOTE)
        assert stored["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "stale",
                                       "uid": "stale"}
        assert stored["metadata"]["namespace"] == "default"
        assert (stored["reportingController"], stored["reportingInstance"]) == (
            CONTROLLER, f"{CONTROLLER}-test")
        deadline = time.monotonic() + 10  # the two later pods: the series, one interval on
        while (api.events()[0].get("series") or {}).get("count") != 3:
            assert time.monotonic() < deadline, api.events()
            time.sleep(0.02)
        assert len(api.events()) == 1
    finally:
        extender.stop()


def test_a_missing_or_unreadable_inventory_is_its_own_warning_and_a_plain_node_gets_none(
        api: FakeClusterApi, extender: RunningExtender) -> None:
    missing = node_object("missing", [16 * GIB])
    del missing["metadata"]["annotations"][INVENTORY_ANNOTATION]
    garbled = node_object("garbled", [16 * GIB], annotations={INVENTORY_ANNOTATION: "{"})
    plain = node_object("plain", [16 * GIB])
    del plain["metadata"]["labels"][ENABLED_LABEL]
    add(api, missing, garbled, plain)
    [pod] = _pods(api, 1)
    result = filtered(extender, api, pod, ["missing", "garbled", "plain"])
    assert result["NodeNames"] == []
    stored = {event["regarding"]["name"]: event for event in _written(api, 2)}
    assert set(stored) == {"missing", "garbled"}
    assert stored["missing"]["reason"] == "GPUInventoryMissing"
    assert stored["missing"]["note"] == result["FailedAndUnresolvableNodes"]["missing"] == (
        "no vcuda GPU inventory: the vcuda node agent does not run on this node")
    assert stored["garbled"]["reason"] == "GPUInventoryUnreadable"
    assert stored["garbled"]["note"] == result["FailedAndUnresolvableNodes"]["garbled"]
    time.sleep(0.2)
    assert len(api.events()) == 2  # none for the node that is not vcuda's


def test_the_shipped_rbac_lets_the_extender_record_its_events(
        api: FakeClusterApi, extender: RunningExtender) -> None:
    api.rules = _shipped_rules()
    add(api, node_object("stale", [16 * GIB], heartbeat=NOW - 600))
    [pod] = _pods(api, 1)
    filtered(extender, api, pod, ["stale"])
    assert _written(api)[0]["reason"] == "GPUInventoryStale"


def test_an_event_the_api_forbids_is_logged_with_the_fix_and_filter_answers_anyway(
        api: FakeClusterApi, tmp_path: Path) -> None:
    log = tmp_path / "extender.log"
    add(api, node_object("stale", [16 * GIB], heartbeat=NOW - 600))
    extender = RunningExtender(api, log)
    try:
        extender.sync(api)
        api.rules = [rule for rule in _shipped_rules() if "events" not in rule.resources]
        [pod] = _pods(api, 1)
        result = filtered(extender, api, pod, ["stale"])
        assert result["FailedAndUnresolvableNodes"]["stale"].startswith(
            "the vcuda node agent last published this node's GPUs 600 s ago")
        deadline = time.monotonic() + 10
        while not (refused := [entry for entry in written_entries(log)
                               if entry["event"] == "event_not_recorded"]):
            assert time.monotonic() < deadline, "the refusal was not logged"
            time.sleep(0.01)
        assert (refused[0]["reason"], refused[0]["node"], refused[0]["status"],
                refused[0]["fix"]) == (
            "GPUInventoryStale", "stale", 403,
            "grant create and patch of events.k8s.io events in default "
            "(manifests/placement/component/extender-rbac.yaml)")
        assert api.events() == []
    finally:
        extender.stop()
