"""The extender's own view of the vcuda nodes (nodeCacheCapable: true): listed and watched from
the fake API server over HTTP, listed again after a watch error, never trusted before it is
listed; and what filter and bind make of it."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import yaml

from extender import nodes
from extender.service import NOT_READY, NOT_VCUDA
from runtime_hook.contract import ENABLED_LABEL, LEDGER_ANNOTATION
from runtime_hook.placement import decode_ledger
from tests.extender.cluster import (
    GIB,
    ROOT,
    RunningExtender,
    binding_args,
    extender_args,
    node_object,
    pod_object,
)
from tests.fake_cluster_api import FakeClusterApi
from tests.fake_kube_api import rules_from_manifests
from tests.json_log import written_entries

EXTENDER_ACCOUNT = "system:serviceaccount:vcuda-system:vcuda-scheduler-extender"


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)


def events(log: Path, name: str) -> list[dict]:
    return [entry for entry in written_entries(log) if entry["event"] == name]


def get(extender: RunningExtender, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", extender.port, timeout=10)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def test_until_the_nodes_are_listed_filter_leaves_every_node_out_and_readyz_says_so(
        api: FakeClusterApi, tmp_path: Path) -> None:
    api.put("/api/v1/nodes/n", node_object("n", [16 * GIB]))
    api.rules = []  # the list is forbidden: the view cannot be built
    log = tmp_path / "extender.log"
    extender = RunningExtender(api, log)
    try:
        eventually(lambda: bool(events(log, "node_watch_failed")))
        assert 'cannot list resource "nodes"' in events(log, "node_watch_failed")[0]["reason"]
        pod = pod_object("p", 10, 1)
        answer = extender.verb("/filter", extender_args(pod, ["n", "m"]))
        assert answer == {"NodeNames": [], "FailedNodes": {"n": NOT_READY, "m": NOT_READY}}
        assert get(extender, "/readyz")[0] == 503
        api.rules = None  # allowed again: the next try lists them
        eventually(lambda: get(extender, "/readyz")[0] == 200)
        assert extender.verb("/filter", extender_args(pod, ["n"]))["NodeNames"] == ["n"]
    finally:
        extender.stop()


def test_a_node_not_labelled_for_vcuda_or_never_seen_is_left_out_for_good(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    unlabelled = node_object("plain", [16 * GIB])
    del unlabelled["metadata"]["labels"]
    api.put("/api/v1/nodes/plain", unlabelled)
    extender.sync(api)
    answer = extender.verb("/filter", extender_args(pod_object("p", 10, 1), ["plain", "gone"]))
    assert answer == {"NodeNames": [], "FailedAndUnresolvableNodes": {
        "plain": NOT_VCUDA, "gone": NOT_VCUDA}}
    assert NOT_VCUDA.startswith("not a vcuda node: it is not labelled vcuda.io/enabled=true")


def test_a_node_that_loses_its_label_or_is_deleted_leaves_the_view(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    for name in ("a", "b"):
        api.put(f"/api/v1/nodes/{name}", node_object(name, [16 * GIB]))
    extender.sync(api)
    pod = pod_object("p", 10, 1)
    assert extender.verb("/filter", extender_args(pod, ["a", "b"]))["NodeNames"] == ["a", "b"]
    relabelled = api.get("/api/v1/nodes/a")
    relabelled["metadata"]["labels"] = {ENABLED_LABEL: "false"}
    api.put("/api/v1/nodes/a", relabelled)
    api.remove("/api/v1/nodes/b")
    eventually(lambda: extender.nodes.get("a") is None and extender.nodes.get("b") is None)
    answer = extender.verb("/filter", extender_args(pod, ["a", "b"]))
    assert answer["FailedAndUnresolvableNodes"] == {"a": NOT_VCUDA, "b": NOT_VCUDA}


def test_a_watch_ended_by_the_api_server_goes_on_from_where_it_was_without_a_new_list(
        api: FakeClusterApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes, "WATCH_SECONDS", 1)
    api.put("/api/v1/nodes/n", node_object("n", [16 * GIB]))
    log = tmp_path / "extender.log"
    extender = RunningExtender(api, log)
    try:
        extender.sync(api)
        eventually(lambda: sum("watch" in r.query for r in api.requests) >= 2)  # ended, again
        api.put("/api/v1/nodes/m", node_object("m", [16 * GIB]))
        extender.sync(api)
        assert len(events(log, "nodes_listed")) == 1 and not events(log, "node_watch_failed")
        first, again = [parse_qs(r.query) for r in api.requests if "watch" in r.query][:2]
        assert first["labelSelector"] == again["labelSelector"] == [f"{ENABLED_LABEL}=true"]
        assert int(again["resourceVersion"][0]) >= int(first["resourceVersion"][0]) > 0
    finally:
        extender.stop()


def test_a_watch_whose_version_is_compacted_away_gets_410_and_the_view_is_listed_again(
        extender: RunningExtender, api: FakeClusterApi, tmp_path: Path) -> None:
    api.put("/api/v1/nodes/n", node_object("n", [16 * GIB]))
    extender.sync(api)
    api.add_pod(pod_object("elsewhere", 10, 1))  # a write the node watch does not carry
    api.forget_node_events()  # compaction: the watch's version is now too old
    log = tmp_path / "extender.log"
    eventually(lambda: len(events(log, "nodes_listed")) == 2)
    [failed] = events(log, "node_watch_failed")
    assert failed["reason"].startswith("the API server ended the node watch: 410 too old "
                                       "resource version")
    api.put("/api/v1/nodes/m", node_object("m", [16 * GIB]))
    extender.sync(api)  # watching again, from the new list
    assert extender.verb("/filter", extender_args(pod_object("p", 10, 1), ["n", "m"]))[
        "NodeNames"] == ["n", "m"]


def test_bind_on_a_node_the_view_shows_behind_the_api_reads_it_again_after_the_conflict(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    api.put("/api/v1/nodes/n", node_object("n", [16 * GIB]))
    pod = pod_object("p", 60, 10)
    api.add_pod(pod)
    extender.sync(api)
    with api.lock:  # written by another replica; its watch event not yet here
        api.objects["/api/v1/nodes/n"]["metadata"]["annotations"][LEDGER_ANNOTATION] = \
            json.dumps({"version": 1, "pods": {}})
        api.stamp(api.objects["/api/v1/nodes/n"])
    api.requests.clear()
    assert extender.verb("/bind", binding_args(pod, "n")) == {}
    node = "/api/v1/nodes/n"
    assert [(r.method, r.path, r.status) for r in api.requests
            if r.path == node or r.path.endswith("/binding")] == [
        ("PATCH", node, 409), ("GET", node, 200), ("PATCH", node, 200),
        ("POST", "/api/v1/namespaces/team/pods/p/binding", 201)]
    ledger = decode_ledger(api.get("/api/v1/nodes/n")["metadata"]["annotations"][
        LEDGER_ANNOTATION])
    assert set(ledger) == {pod["metadata"]["uid"]}


def test_the_shipped_rbac_lets_the_extender_watch_the_nodes_and_bind(
        api: FakeClusterApi, tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all(
        (ROOT / "manifests" / "placement" / "component" / "extender-rbac.yaml").read_text()))
    api.rules = rules_from_manifests(documents, EXTENDER_ACCOUNT)
    api.put("/api/v1/nodes/n", node_object("n", [16 * GIB]))
    pod = pod_object("p", 10, 1)
    api.add_pod(pod)
    log = tmp_path / "extender.log"
    extender = RunningExtender(api, log)
    try:
        extender.sync(api)
        assert extender.verb("/filter", extender_args(pod, ["n"]))["NodeNames"] == ["n"]
        assert extender.verb("/bind", binding_args(pod, "n")) == {}
        assert not events(log, "node_watch_failed")
        assert {r.status for r in api.requests} <= {200, 201}
    finally:
        extender.stop()


@pytest.mark.parametrize(("line", "message"), [
    (b"{not json", "a node watch event is not JSON of an event: it is not JSON: it goes wrong "
                   "at character 1"),
    (b'{"object": {}}', "a node watch event is not JSON of an event: the event has no type, "
                        "which it must have"),
    (b'{"type": "RENAMED", "object": {"metadata": {"name": "n"}}}',
     "a node watch event of unknown type 'RENAMED'"),
    (b'{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", '
     b'"message": "too old resource version: 5 (9)"}}',
     "the API server ended the node watch: 410 too old resource version: 5 (9)"),
])
def test_a_watch_event_that_cannot_be_applied_ends_the_watch_with_the_reason(
        line: bytes, message: str) -> None:
    view = nodes.NodeView()
    view.replace([nodes.Meta("n", "3", {})], "3")
    watch = nodes.NodeWatch(None, view, None)  # type: ignore[arg-type]  # no call is made
    with pytest.raises(nodes.WatchError) as raised:
        watch._apply(line)
    assert str(raised.value) == message
    assert view.get("n") == nodes.Meta("n", "3", {})  # nothing applied


def test_watch_events_keep_the_view_and_never_take_a_node_back_to_an_older_version() -> None:
    view = nodes.NodeView()
    view.replace([nodes.Meta("n", "3", {"a": "1"})], "3")
    watch = nodes.NodeWatch(None, view, None)  # type: ignore[arg-type]  # no call is made
    view.put(nodes.Meta("n", "7", {"a": "bind's write"}))  # answered before its event came
    for line in (b'{"type": "MODIFIED", "object": {"metadata": {"name": "n", '
                 b'"resourceVersion": "5", "annotations": {"a": "older"}}}}',
                 b'{"type": "ADDED", "object": {"metadata": {"name": "m", '
                 b'"resourceVersion": "6"}}}',
                 b'{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "8"}}}'):
        watch._apply(line)
    assert view.get("n") == nodes.Meta("n", "7", {"a": "bind's write"})
    assert view.get("m") == nodes.Meta("m", "6", None)
    assert view.version == "8"
    watch._apply(b'{"type": "DELETED", "object": {"metadata": {"name": "m", '
                 b'"resourceVersion": "9"}}}')
    assert view.get("m") is None and view.version == "9"


def test_an_unexpected_fault_in_the_watch_makes_the_view_not_ready_and_it_is_listed_again(
        api: FakeClusterApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api.put("/api/v1/nodes/n", node_object("n", [16 * GIB]))
    log = tmp_path / "extender.log"
    extender = RunningExtender(api, log)
    try:
        extender.sync(api)
        apply = nodes.NodeWatch._apply
        faults = [RuntimeError("a fault of the extender's own")]

        def faulty(watch: nodes.NodeWatch, line: bytes) -> None:
            if faults:
                raise faults.pop()
            apply(watch, line)

        monkeypatch.setattr(nodes.NodeWatch, "_apply", faulty)
        api.put("/api/v1/nodes/m", node_object("m", [16 * GIB]))
        eventually(lambda: len(events(log, "nodes_listed")) == 2)
        [failed] = events(log, "node_watch_failed")
        assert failed["reason"] == "RuntimeError: a fault of the extender's own"
        extender.sync(api)  # the new list has m
        assert extender.verb("/filter", extender_args(pod_object("p", 10, 1), ["n", "m"]))[
            "NodeNames"] == ["n", "m"]
    finally:
        extender.stop()
