"""The extender over HTTP as kube-scheduler calls it, binding against the fake API server."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import pytest

from extender import policy
from extender.server import main as extender_main
from extender.service import EXPECTED_NODES
from runtime_hook.contract import ASSIGNMENT_ANNOTATION, LEDGER_ANNOTATION
from runtime_hook.placement import (
    Assignment,
    Entry,
    decode_assignment,
    decode_ledger,
    encode_ledger,
)
from tests.extender.cluster import (
    GIB,
    NOW,
    RunningExtender,
    add,
    binding_args,
    extender_args,
    filtered,
    gpu_uuid,
    node_object,
    pod_object,
)
from tests.fake_cluster_api import FakeClusterApi


def stored_node(api: FakeClusterApi, name: str) -> dict:
    return api.get(f"/api/v1/nodes/{name}")


def stored_pod(api: FakeClusterApi, pod: dict) -> dict:
    return api.get(f"/api/v1/namespaces/team/pods/{pod['metadata']['name']}")


def bind(extender: RunningExtender, pod: dict, node: str) -> str:
    return extender.verb("/bind", binding_args(pod, node)).get("Error", "")


def test_filter_keeps_only_nodes_where_one_gpu_holds_the_share(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("roomy", [16 * GIB, 16 * GIB]), node_object("split", [8 * GIB] * 4))
    pod = pod_object("p", cores=30, memory_gib=10)
    result = filtered(extender, api, pod, ["roomy", "split"])
    assert result["NodeNames"] == ["roomy"]
    assert result["FailedNodes"] == {
        "split": "no GPU has 30 percent and 10 GiB free (GPU 0 has 100 percent and 8 GiB free, "
                 "the closest)"}


def test_a_node_whose_agent_stopped_publishing_is_filtered_out_for_good_with_the_reason(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("stale", [16 * GIB], heartbeat=NOW - 600))
    result = filtered(extender, api, pod_object("p", 10, 1), ["stale"])
    assert result["NodeNames"] == []
    assert result["FailedAndUnresolvableNodes"]["stale"].startswith(
        "the vcuda node agent last published this node's GPUs 600 s ago (limit 120 s)")


def test_a_pod_not_admitted_by_the_webhook_fails_every_node_with_what_to_do(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [GIB]))
    pod = pod_object("p", cores=30, memory_gib=1)
    del pod["metadata"]["annotations"]
    result = filtered(extender, api, pod, ["n"])
    assert "recreate the pod through it" in result["FailedAndUnresolvableNodes"]["n"]


def test_prioritize_scores_the_fuller_node_higher_under_binpack(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("busy", [16 * GIB] * 2), node_object("empty", [16 * GIB] * 2))
    first = add(api, pod_object("first", cores=50, memory_gib=8))[0]
    assert bind(extender, first, "busy") == ""
    scores = filtered(extender, api, pod_object("p", 20, 2), ["busy", "empty"], "/prioritize")
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert by_host["busy"] > by_host["empty"] >= 0 and max(by_host.values()) <= 10


def test_bind_records_the_gpu_in_the_ledger_and_on_the_pod_and_binds_it(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB, 16 * GIB]))
    pod = add(api, pod_object("p", cores=30, memory_gib=10))[0]
    assert bind(extender, pod, "n") == ""
    stored = stored_pod(api, pod)
    assert stored["spec"]["nodeName"] == "n"
    assignment = decode_assignment(stored["metadata"]["annotations"][ASSIGNMENT_ANNOTATION])
    assert assignment.shared == (gpu_uuid("n", 0), 30, 10 * GIB)
    ledger = decode_ledger(stored_node(api, "n")["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert ledger[pod["metadata"]["uid"]].assignment == assignment
    assert ledger[pod["metadata"]["uid"]].pod == "team/p"


def test_bind_of_a_two_gpu_share_records_both_gpus_in_the_ledger_and_on_the_pod(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB, 16 * GIB]))
    pod = add(api, pod_object("p", cores=30, memory_gib=10, gpus=2))[0]
    assert bind(extender, pod, "n") == ""
    stored = stored_pod(api, pod)
    assignment = decode_assignment(stored["metadata"]["annotations"][ASSIGNMENT_ANNOTATION])
    assert assignment.shared == (gpu_uuid("n", 0), 30, 10 * GIB)
    assert assignment.shared_gpus() == (gpu_uuid("n", 0), gpu_uuid("n", 1))
    ledger = decode_ledger(stored_node(api, "n")["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert ledger[pod["metadata"]["uid"]].assignment == assignment
    # Both GPUs now hold 30%: a second two-GPU share of 80% fits on neither.
    second = add(api, pod_object("q", cores=80, memory_gib=1, gpus=2))[0]
    assert "2 GPUs with 80 percent and 1 GiB free each wanted, 0 of 2 have it" in bind(
        extender, second, "n")


def test_a_bind_that_no_longer_fits_fails_with_the_reason_and_leaves_no_ledger_line(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    first, second = add(api, pod_object("a", 60, 10), pod_object("b", 60, 10))
    assert bind(extender, first, "n") == ""
    error = bind(extender, second, "n")
    assert error == "node n: no GPU has 60 percent and 10 GiB free (GPU 0 has 40 percent and " \
                    "6 GiB free, the closest)"
    ledger = decode_ledger(stored_node(api, "n")["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert set(ledger) == {first["metadata"]["uid"]}
    assert "nodeName" not in stored_pod(api, second)["spec"]


def test_a_concurrent_bind_on_the_same_node_makes_the_ledger_write_retry_and_see_it(
        extender: RunningExtender, api: FakeClusterApi, tmp_path: Path) -> None:
    add(api, node_object("n", [16 * GIB]))
    mine, theirs = add(api, pod_object("mine", 60, 10), pod_object("theirs", 60, 10))
    other = RunningExtender(api, tmp_path / "other.log")
    node_path = "/api/v1/nodes/n"

    def the_other_replica_binds_first(path: str) -> None:
        if path == node_path:  # our ledger write is about to land: the other one wins the race
            api.before_write = None
            api.lock.release()  # let the other replica's requests be served meanwhile
            try:
                assert bind(other, theirs, "n") == ""
            finally:
                api.lock.acquire()

    api.before_write = the_other_replica_binds_first
    try:
        error = bind(extender, mine, "n")
    finally:
        other.stop()
    assert error.startswith("node n: no GPU has 60 percent and 10 GiB free")
    ledger = decode_ledger(stored_node(api, "n")["metadata"]["annotations"][LEDGER_ANNOTATION])
    assert set(ledger) == {theirs["metadata"]["uid"]}


def test_a_pod_filtered_while_a_bind_is_writing_counts_the_room_that_bind_takes(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    first, second = add(api, pod_object("a", 60, 10), pod_object("b", 60, 10))
    filtered(extender, api, stored_pod(api, first), ["n"])
    next_pod = stored_pod(api, second)  # read now: the held write holds the API's lock
    writing, written = threading.Event(), threading.Event()

    def hold_the_ledger_write(path: str) -> None:
        if path == "/api/v1/nodes/n":
            writing.set()
            written.wait(10)

    api.before_write = hold_the_ledger_write
    errors: list[str] = []
    binding = threading.Thread(target=lambda: errors.append(bind(extender, first, "n")))
    binding.start()
    try:
        assert writing.wait(10)
        answer = extender.verb("/filter", extender_args(next_pod, ["n"]))
    finally:
        written.set()
        binding.join()
    assert answer["FailedNodes"] == {"n": "no GPU has 60 percent and 10 GiB free (GPU 0 has "
                                          "40 percent and 6 GiB free, the closest)"}
    assert errors == [""]


def test_a_bind_on_a_node_outside_the_best_scored_ones_counts_only_once_written(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    busy = node_object("busy", [16 * GIB], annotations={LEDGER_ANNOTATION: encode_ledger({
        "other-uid": Entry("team/other", int(NOW), Assignment((gpu_uuid("busy", 0), 30, GIB),
                                                             ()))})})
    empty = [node_object(f"e{i:02d}", [16 * GIB]) for i in range(EXPECTED_NODES)]
    names = [n["metadata"]["name"] for n in add(api, busy, *empty)]  # busy first: 17th is last
    first, second = add(api, pod_object("a", 60, 10), pod_object("b", 60, 10))
    filtered(extender, api, stored_pod(api, first), names)
    next_pod = stored_pod(api, second)
    writing, written = threading.Event(), threading.Event()

    def hold_the_ledger_write(path: str) -> None:
        if path == f"/api/v1/nodes/{empty[-1]['metadata']['name']}":
            writing.set()
            written.wait(10)

    api.before_write = hold_the_ledger_write
    binding = threading.Thread(target=bind, args=(extender, first, empty[-1]["metadata"][
        "name"]))
    binding.start()
    try:
        assert writing.wait(10)
        answer = extender.verb("/filter", extender_args(next_pod, names))
    finally:
        written.set()
        binding.join()
    assert answer["NodeNames"] == names  # the last one too: a not counted


def test_bind_takes_the_gpu_filter_found_while_it_still_fits(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    node = add(api, node_object("n", [16 * GIB, 16 * GIB]))[0]
    pod = add(api, pod_object("a", 10, 1))[0]
    kept = filtered(extender, api, stored_pod(api, pod), ["n"])
    assert kept["NodeNames"] == ["n"]  # on GPU 0
    # Meanwhile another replica bound a pod on GPU 1: binpack alone would now pick GPU 1.
    other = Entry("team/other", int(NOW), Assignment((gpu_uuid("n", 1), 30, 2 * GIB), ()))
    node["metadata"]["annotations"][LEDGER_ANNOTATION] = encode_ledger({"other-uid": other})
    add(api, node)
    assert bind(extender, pod, "n") == ""
    assignment = decode_assignment(stored_pod(api, pod)["metadata"]["annotations"][
        ASSIGNMENT_ANNOTATION])
    assert assignment.shared == (gpu_uuid("n", 0), 10, GIB)


def test_a_pod_replaced_under_the_same_name_is_not_bound(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    pod = add(api, pod_object("p", 10, 1))[0]
    replaced = json.loads(binding_args(pod, "n"))
    replaced["PodUID"] = "another-uid"
    error = extender.verb("/bind", json.dumps(replaced).encode())["Error"]
    assert error.startswith("pod team/p was replaced")


def test_bind_after_filter_uses_the_pod_the_scheduler_sent_and_the_node_as_last_seen(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    pod = stored_pod(api, add(api, pod_object("p", 10, 1))[0])  # as the scheduler's cache
    filtered(extender, api, pod, ["n"])
    api.requests.clear()
    assert bind(extender, pod, "n") == ""
    assert [(r.method, r.path) for r in api.requests if "watch" not in r.query] == [
        ("PATCH", "/api/v1/nodes/n"), ("POST", "/api/v1/namespaces/team/pods/p/binding")]
    assert stored_pod(api, pod)["spec"]["nodeName"] == "n"


def test_the_ledger_a_bind_wrote_is_counted_by_the_next_filter_without_decoding_it_again(
        extender: RunningExtender, api: FakeClusterApi, monkeypatch: pytest.MonkeyPatch) -> None:
    add(api, node_object("n", [16 * GIB]))
    first = stored_pod(api, add(api, pod_object("p", 60, 1))[0])
    filtered(extender, api, first, ["n"])
    assert bind(extender, first, "n") == ""
    decoded: list[str] = []
    decode = policy.decode_ledger
    monkeypatch.setattr(policy, "decode_ledger", lambda text: decoded.append(text) or decode(text))
    second = stored_pod(api, add(api, pod_object("q", 50, 1))[0])
    written = stored_node(api, "n")
    answer = extender.verb("/filter", extender_args(second, ["n"]))  # the view has the write
    assert answer["FailedNodes"] == {"n": "no GPU has 50 percent and 1 GiB free (GPU 0 has "
                                            "40 percent and 15 GiB free, the closest)"}
    assert decoded == []
    text = written["metadata"]["annotations"][LEDGER_ANNOTATION]
    assert dict(policy.ledger_entries(text)) == decode(text)


def test_a_pod_replaced_after_filter_is_not_bound_and_its_room_is_given_back(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    old = add(api, pod_object("p", 10, 1))[0]
    filtered(extender, api, stored_pod(api, old), ["n"])
    api.remove("/api/v1/namespaces/team/pods/p")
    add(api, pod_object("p", 10, 1))
    assert bind(extender, old, "n").startswith("pod team/p was replaced")
    annotations = stored_node(api, "n")["metadata"]["annotations"]
    assert decode_ledger(annotations.get(LEDGER_ANNOTATION)) == {}


def test_whole_gpu_pods_get_unused_gpus_and_shared_pods_never_land_on_them(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB] * 2))
    whole, shared, late = add(api, pod_object("w", whole=1), pod_object("s", 50, 4),
                              pod_object("late", whole=1))
    assert bind(extender, whole, "n") == ""
    assert bind(extender, shared, "n") == ""
    assert bind(extender, late, "n") == "node n: 1 whole GPU wanted, 0 of 2 unused"
    got_whole = decode_assignment(stored_pod(api, whole)["metadata"]["annotations"][
        ASSIGNMENT_ANNOTATION]).whole
    got_shared = decode_assignment(stored_pod(api, shared)["metadata"]["annotations"][
        ASSIGNMENT_ANNOTATION]).shared
    assert got_shared[0] not in got_whole


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/filter", b"{not json", "not ExtenderArgs: it is not JSON: it goes wrong at character 1"),
    ("/filter", b'{"Nodes": null, "NodeNames": ["a"]}', "ExtenderArgs without a pod"),
    ("/filter", b'{"Pod": {"metadata": {}}, "NodeNames": ["a"]}',
     "ExtenderArgs.Pod has no metadata or spec object"),
    ("/filter", b'{"Pod": {"metadata": {}, "spec": {}}, "Nodes": {"items": []}, '
                b'"NodeNames": null}',
     "ExtenderArgs has Nodes and no NodeNames: configure this extender with "
     "nodeCacheCapable: true"),
    ("/prioritize", b'{"pod": {"metadata": {}, "spec": {}}, "nodes": {"items": []}}',
     "configure this extender with nodeCacheCapable: true"),
    ("/filter", b'{"Pod": {"metadata": {}, "spec": {}}, "Nodes": null, "NodeNames": null}',
     'ExtenderArgs without node names: the body needs "NodeNames"'),
    ("/prioritize", b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": ["a", ""]}',
     "ExtenderArgs.NodeNames[1] is empty"),
    ("/filter", b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": 3}',
     "ExtenderArgs.NodeNames is a number, where a list or null belongs"),
    ("/filter", b'{"Pod": {"metadata": {}, "spec": {}}, "NodeNames": [7]}',
     "ExtenderArgs.NodeNames[0] is a number, where a string belongs"),
    ("/bind", b'{"PodName": "p", "PodNamespace": "team", "PodUID": "u"}',
     "ExtenderBindingArgs.Node is empty"),
    ("/bind", b'[]', "not ExtenderBindingArgs: ExtenderBindingArgs is a list, where an object "
                     "belongs"),
])
def test_malformed_arguments_get_400_with_a_message(extender: RunningExtender, path: str,
                                                    body: bytes, message: str) -> None:
    status, payload = extender.post(path, body)
    assert status == 400
    assert payload.decode().startswith("bad extender request: ")
    assert message in payload.decode()


@pytest.mark.parametrize("value", ["70000", "-1", "x"])
def test_port_must_be_a_tcp_port(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        extender_main(["--port", value])
    assert done.value.code == 2
    assert f"argument --port: {value!r} is not a port: write 1..65535" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_max_age_must_be_a_finite_number_of_seconds(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        extender_main(["--max-age", value])
    assert done.value.code == 2
    assert f"argument --max-age: {value!r} is not a number of seconds" in capsys.readouterr().err


def test_credentials_from_a_kubeconfig_authenticate_to_the_api(api: FakeClusterApi,
                                                               tmp_path: Path) -> None:
    import asyncio

    from webhook.kube import Credentials, Kube

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig())
    add(api, node_object("n", [GIB]))

    async def read() -> dict:
        kube = Kube(Credentials.load(str(kubeconfig)))
        try:
            return await kube.get("/api/v1/nodes/n")
        finally:
            await kube.close()

    assert asyncio.run(read())["metadata"]["name"] == "n"


def test_room_of_a_pod_bound_then_deleted_comes_back_once_its_ledger_line_is_pruned(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    add(api, node_object("n", [16 * GIB]))
    first = add(api, pod_object("first", 60, 10))[0]
    assert bind(extender, first, "n") == ""
    later = pod_object("later", 60, 10)
    assert filtered(extender, api, later, ["n"])["NodeNames"] == []  # the first pod holds it
    pruned = stored_node(api, "n")
    pruned["metadata"]["annotations"][LEDGER_ANNOTATION] = '{"version":1,"pods":{}}'
    add(api, pruned)  # as the node agent prunes the line of a pod gone
    assert filtered(extender, api, later, ["n"])["NodeNames"] == ["n"]


def test_room_of_a_pod_whose_line_was_pruned_before_filter_saw_it_comes_back_at_the_next_heartbeat(
        api: FakeClusterApi, tmp_path: Path) -> None:
    clock = [NOW]
    extender = RunningExtender(api, tmp_path / "extender.log", clock=lambda: clock[0])
    try:
        add(api, node_object("n", [16 * GIB]))
        first = add(api, pod_object("first", 60, 10))[0]
        assert bind(extender, first, "n") == ""
        later = pod_object("later", 60, 10)
        add(api, node_object("n", [16 * GIB], heartbeat=NOW))  # line pruned, no heartbeat since
        held = filtered(extender, api, later, ["n"])
        assert held["NodeNames"] == []  # the bind the view does not show is counted
        clock[0] = NOW + 5
        add(api, node_object("n", [16 * GIB], heartbeat=NOW + 4))  # published after the bind
        assert filtered(extender, api, later, ["n"])["NodeNames"] == ["n"]
    finally:
        extender.stop()


def test_a_burst_of_binds_on_more_connections_than_the_old_cap_of_128_is_answered_in_full(
        extender: RunningExtender, api: FakeClusterApi) -> None:
    # kube-scheduler opens a connection per bind in flight; against a slow API server they
    # pile up. Here the API server stalls its first write until every bind is sent.
    add(api, node_object("n", [16 * GIB]))
    pods = add(api, *(pod_object(f"p{i}") for i in range(300)))  # no GPU: the Binding only
    sent = threading.Event()

    def stall_until_every_bind_is_sent(path: str) -> None:
        api.before_write = None
        sent.wait(30)

    api.before_write = stall_until_every_bind_is_sent
    connections = []
    try:
        for pod in pods:
            connection = http.client.HTTPConnection("127.0.0.1", extender.port, timeout=60)
            connection.request("POST", "/bind", binding_args(pod, "n"),
                               {"Content-Type": "application/json"})
            connections.append(connection)
        sent.set()
        answers = []
        for connection in connections:
            answer = connection.getresponse()
            answers.append((answer.status, answer.read()))
    finally:
        sent.set()
        for connection in connections:
            connection.close()
    assert answers == [(200, b"{}")] * len(pods)
    assert all(stored_pod(api, pod)["spec"]["nodeName"] == "n" for pod in pods)
