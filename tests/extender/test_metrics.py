"""The extender's /metrics, scraped over HTTP and read with Prometheus' own parser: calls by verb
and outcome with their latency, bind conflicts redone, nodes left out for stale inventory or
for not being vcuda nodes."""

from __future__ import annotations

import http.client
import json

from prometheus_client.parser import text_string_to_metric_families

from runtime_hook.contract import LEDGER_ANNOTATION, VERSION
from runtime_hook.placement import decode_ledger
from tests.extender.cluster import (
    GIB,
    NOW,
    RunningExtender,
    binding_args,
    extender_args,
    node_object,
    pod_object,
)
from tests.fake_cluster_api import FakeClusterApi

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(extender: RunningExtender) -> Samples:
    connection = http.client.HTTPConnection("127.0.0.1", extender.port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        answer = connection.getresponse()
        assert answer.status == 200
        assert answer.getheader("Content-Type", "").startswith("text/plain; version=")
        text = answer.read().decode()
    finally:
        connection.close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def calls(found: Samples, verb: str, outcome: str) -> float:
    return found[("vcuda_extender_requests_total", (("outcome", outcome), ("verb", verb)))]


def test_calls_are_counted_by_verb_and_outcome_with_their_latency(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    node = node_object("n", [16 * GIB])
    api.put("/api/v1/nodes/n", node)
    big, small = pod_object("big", 60, 10), pod_object("small", 60, 10)
    for pod in (big, small):
        api.add_pod(pod)
        extender.sync(api)
        extender.verb("/filter", extender_args(pod, ["n"]))
    extender.verb("/prioritize", extender_args(big, ["n"]))
    assert extender.verb("/bind", binding_args(big, "n")) == {}
    assert "Error" in extender.verb("/bind", binding_args(small, "n"))  # no room left
    assert extender.post("/filter", b"{}")[0] == 400
    found = scrape(extender)
    assert calls(found, "filter", "ok") == 2
    assert calls(found, "filter", "bad_request") == 1
    assert calls(found, "prioritize", "ok") == 1
    assert calls(found, "bind", "ok") == 1
    assert calls(found, "bind", "refused") == 1
    assert calls(found, "prioritize", "refused") == 0
    count = found[("vcuda_extender_request_seconds_count", (("verb", "filter"),))]
    assert count == 3
    assert found[("vcuda_extender_request_seconds_bucket", (("le", "+Inf"), ("verb", "filter")))] \
        == 3
    assert found[("vcuda_extender_request_seconds_bucket", (("le", "0.0005"), ("verb", "bind")))] \
        <= found[("vcuda_extender_request_seconds_bucket", (("le", "5.0"), ("verb", "bind")))]
    assert found[("vcuda_extender_request_seconds_sum", (("verb", "bind"),))] > 0


def test_a_node_whose_agent_stopped_publishing_is_counted_as_left_out_for_stale_inventory(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    stale = node_object("stale", [16 * GIB], heartbeat=NOW - 600)
    bare = node_object("bare", [16 * GIB])
    del bare["metadata"]["annotations"]
    fresh = node_object("fresh", [GIB])  # too small: failed, not left out
    for node in (stale, bare, fresh):
        api.put(f"/api/v1/nodes/{node['metadata']['name']}", node)
    extender.sync(api)
    for _ in range(2):
        extender.verb("/filter", extender_args(pod_object("p", 10, 2),
                                               ["stale", "bare", "fresh", "unknown"]))
    found = scrape(extender)
    left_out = "vcuda_extender_nodes_left_out_total"
    assert found[(left_out, (("cause", "stale_inventory"),))] == 2
    assert found[(left_out, (("cause", "no_inventory"),))] == 2
    assert found[(left_out, (("cause", "not_vcuda_node"),))] == 2
    assert found[(left_out, (("cause", "unreadable_inventory"),))] == 0


def test_bind_conflicts_redone_are_counted_by_the_write_that_met_them(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    api.put("/api/v1/nodes/n", node_object("n", [16 * GIB]))
    pod = pod_object("p", 10, 1)
    pod_path = api.add_pod(pod)
    moved: list[str] = []

    def another_client_writes_first(path: str) -> None:
        if path not in moved:  # once for the node's ledger, once for the pod's Binding
            moved.append(path)
            api.bump(path)

    api.before_write = another_client_writes_first
    assert extender.verb("/bind", binding_args(pod, "n")) == {}
    assert moved == ["/api/v1/nodes/n", pod_path]
    found = scrape(extender)
    assert found[("vcuda_extender_bind_conflicts_total", (("write", "ledger"),))] == 1
    assert found[("vcuda_extender_bind_conflicts_total", (("write", "binding"),))] == 1
    assert calls(found, "bind", "ok") == 1


def test_binds_to_one_node_at_once_take_turns_and_meet_no_conflict(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    api.put("/api/v1/nodes/n", node_object("n", [16 * GIB, 16 * GIB]))
    pods = [pod_object(f"p{index}", 10, 1) for index in range(8)]
    for pod in pods:
        api.add_pod(pod)
    extender.sync(api)
    answers = [extender.sent("/bind", binding_args(pod, "n")) for pod in pods]
    assert [json.loads(answer()) for answer in answers] == [{}] * len(pods)
    ledger = decode_ledger(api.get("/api/v1/nodes/n")["metadata"]["annotations"][
        LEDGER_ANNOTATION])
    assert set(ledger) == {pod["metadata"]["uid"] for pod in pods}
    found = scrape(extender)
    assert found[("vcuda_extender_bind_conflicts_total", (("write", "ledger"),))] == 0
    assert calls(found, "bind", "ok") == len(pods)


def test_the_release_is_a_build_info_gauge_at_one(extender: RunningExtender) -> None:
    assert scrape(extender)[("vcuda_build_info", (("version", VERSION),))] == 1
