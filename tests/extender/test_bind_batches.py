"""Binds that arrive for one node while its ledger is being written are written together in the
next write, each placed after the ones before it; one that no longer fits is refused alone."""

from __future__ import annotations

import json
import threading
import time

from runtime_hook.contract import LEDGER_ANNOTATION
from runtime_hook.placement import decode_ledger
from tests.extender.cluster import (
    GIB,
    RunningExtender,
    binding_args,
    extender_args,
    node_object,
    pod_object,
)
from tests.fake_cluster_api import FakeClusterApi

NODE = "/api/v1/nodes/n"


def _ledger_writes(api: FakeClusterApi) -> int:
    return sum(1 for r in api.requests if r.method == "PATCH" and r.path == NODE)


def _filtered(extender: RunningExtender, api: FakeClusterApi, pods: list[dict]) -> None:
    """Each pod through filter first, as the scheduler sends it: its bind then reads nothing
    but the node (the fake API server answers nothing while a write is held up)."""
    for pod in pods:
        api.add_pod(pod)
    extender.sync(api)
    for pod in pods:
        assert extender.verb("/filter", extender_args(pod, ["n"]))["NodeNames"] == ["n"]


def _first_write_slow(api: FakeClusterApi) -> threading.Event:
    """The first ledger write waits until the returned event is set (as a busy API server
    would), so the binds sent meanwhile queue behind it."""
    go, seen = threading.Event(), []

    def wait_once(path: str) -> None:
        if path == NODE and not seen:
            seen.append(path)
            go.wait(10)
    api.before_write = wait_once
    return go


def test_binds_waiting_for_a_node_are_written_in_one_ledger_write(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    api.put(NODE, node_object("n", [16 * GIB, 16 * GIB]))
    pods = [pod_object(f"p{index}", 20, 1) for index in range(9)]
    _filtered(extender, api, pods)
    go = _first_write_slow(api)
    first = extender.sent("/bind", binding_args(pods[0], "n"))
    time.sleep(0.3)  # the first bind holds the node's turn, its write held up
    rest = [extender.sent("/bind", binding_args(pod, "n")) for pod in pods[1:]]
    time.sleep(0.3)
    go.set()
    assert [json.loads(answer()) for answer in (first, *rest)] == [{}] * len(pods)
    assert _ledger_writes(api) == 2  # the first alone, then the eight that waited
    ledger = decode_ledger(api.get(NODE)["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert set(ledger) == {pod["metadata"]["uid"] for pod in pods}
    cores: dict[str, int] = {}
    for entry in ledger.values():
        assert entry.assignment.shared is not None
        gpu, share, _ = entry.assignment.shared
        cores[gpu] = cores.get(gpu, 0) + share
    assert sorted(cores.values()) == [80, 100]  # binpack: one GPU filled, not nine on one


def test_a_bind_of_a_batch_that_no_longer_fits_is_refused_and_the_others_bound(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    api.put(NODE, node_object("n", [16 * GIB]))
    pods = [pod_object(f"p{index}", 40, 1) for index in range(3)]
    _filtered(extender, api, pods)
    go = _first_write_slow(api)
    first = extender.sent("/bind", binding_args(pods[0], "n"))
    time.sleep(0.3)
    rest = [extender.sent("/bind", binding_args(pod, "n")) for pod in pods[1:]]
    time.sleep(0.3)
    go.set()
    answers = [json.loads(answer()) for answer in (first, *rest)]
    assert answers[:2] == [{}, {}]
    assert answers[2]["Error"].startswith("node n: no GPU has 40 percent")
    ledger = decode_ledger(api.get(NODE)["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert set(ledger) == {pod["metadata"]["uid"] for pod in pods[:2]}
    assert "nodeName" not in api.get(f"/api/v1/namespaces/team/pods/{pods[2]['metadata']['name']}")[
        "spec"]
