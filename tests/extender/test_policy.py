"""The placement policy, called directly: a pod's need, fit on one GPU, binpack and spread."""

from __future__ import annotations

import json

import pytest

from extender import policy
from extender.policy import (
    UNREADABLE_INVENTORY,
    Demand,
    DemandError,
    Unfit,
    ledger_text,
    node_gpus,
    place,
    placement,
    pod_demand,
)
from runtime_hook.contract import INVENTORY_ANNOTATION, LEDGER_ANNOTATION, Gpu
from runtime_hook.placement import (
    Assignment,
    Entry,
    PlacementError,
    decode_inventory,
    decode_ledger,
    encode_inventory,
    encode_ledger,
)
from tests.extender.cluster import CORE_KEYS, GIB, NOW, gpu_uuid, node_object, pod_object


def view(memories: list[int], used: dict[str, Assignment] | None = None, heartbeat: float = NOW,
         max_age: float = 120.0):
    ledger = {uid: Entry("team/p", int(NOW), a) for uid, a in (used or {}).items()}
    node = node_object("n1", memories, heartbeat,
                       {LEDGER_ANNOTATION: encode_ledger(ledger)} if ledger else None)
    return node_gpus("n1", node["metadata"]["annotations"], NOW, max_age)


def shared_on(index: int, cores: int, memory_gib: float) -> Assignment:
    return Assignment((gpu_uuid("n1", index), cores, int(memory_gib * GIB)), ())


def test_a_pods_need_adds_its_containers_and_takes_the_largest_init_container() -> None:
    pod = pod_object("p", cores=30, memory_gib=10, init=(50, 2))
    pod["spec"]["containers"].append(pod["spec"]["containers"][0] | {"name": "second"})
    pod["metadata"]["annotations"]["vcuda.io/limits"] = (
        '{"share": {"cores": 30, "memory": 10737418240}, "second": {"cores": 20, '
        '"memory": 1073741824}, "prepare": {"cores": 50, "memory": 2147483648}}')
    assert pod_demand(pod, CORE_KEYS) == Demand(50, 11 * GIB, 0)


def test_a_sidecar_init_container_runs_alongside_and_adds_up() -> None:
    pod = pod_object("p", cores=30, memory_gib=10, init=(20, 2))
    pod["spec"]["initContainers"][0]["restartPolicy"] = "Always"
    assert pod_demand(pod, CORE_KEYS) == Demand(50, 12 * GIB, 0)


def test_whole_gpus_are_counted_from_vcuda_core_in_hundreds() -> None:
    assert pod_demand(pod_object("p", whole=2), CORE_KEYS) == Demand(0, 0, 2)


def test_whole_gpus_asked_for_by_the_device_plugins_name_count_too() -> None:
    pod = pod_object("p")
    pod["spec"]["containers"][0]["resources"]["limits"] = {"vcuda.io/gpu": "3"}
    assert pod_demand(pod, CORE_KEYS) == Demand(0, 0, 3)


def test_a_shared_container_without_the_webhooks_annotation_is_an_error_naming_it() -> None:
    pod = pod_object("p", cores=30, memory_gib=10)
    del pod["metadata"]["annotations"]
    with pytest.raises(DemandError, match=r'container "share" shares a GPU but has no valid '
                                          r"entry in vcuda\.io/limits"):
        pod_demand(pod, CORE_KEYS)


@pytest.mark.parametrize("entry", ['{"cores": 100, "memory": 1}', '{"cores": 30, "memory": "1"}',
                                   '{"cores": true, "memory": 1}', '{"cores": 30}'])
def test_an_entry_the_hook_would_refuse_is_an_error_naming_the_container(entry: str) -> None:
    # The contract reads the annotation for both, so the extender places no pod the hook refuses.
    pod = pod_object("p", cores=30, memory_gib=10)
    pod["metadata"]["annotations"]["vcuda.io/limits"] = f'{{"share": {entry}}}'
    with pytest.raises(DemandError, match='container "share" shares a GPU but has no valid entry'):
        pod_demand(pod, CORE_KEYS)


def test_an_annotation_that_is_not_a_json_object_is_an_error() -> None:
    pod = pod_object("p", cores=30, memory_gib=10)
    pod["metadata"]["annotations"]["vcuda.io/limits"] = "[1]"
    with pytest.raises(DemandError, match=r"annotation is not a JSON object"):
        pod_demand(pod, CORE_KEYS)


def test_shares_of_one_pod_that_add_up_to_a_whole_gpu_are_refused() -> None:
    pod = pod_object("p", cores=60, memory_gib=1)
    pod["spec"]["containers"].append(pod["spec"]["containers"][0] | {"name": "second"})
    pod["metadata"]["annotations"]["vcuda.io/limits"] = (
        '{"share": {"cores": 60, "memory": 1}, "second": {"cores": 60, "memory": 1}}')
    with pytest.raises(DemandError, match="120 percent of one GPU together"):
        pod_demand(pod, CORE_KEYS)


def test_a_node_whose_total_fits_but_no_single_gpu_does_is_unfit_with_the_closest_gpu() -> None:
    node = view([16 * GIB, 16 * GIB], {"a": shared_on(0, 50, 10), "b": shared_on(1, 50, 10)})
    with pytest.raises(Unfit, match=r"no GPU has 30 percent and 8 GiB free \(GPU 0 has "
                                    r"50 percent and 6 GiB free, the closest\)") as caught:
        place(node, Demand(30, 8 * GIB, 0))
    assert not caught.value.final


def test_binpack_takes_the_fullest_gpu_that_fits_and_spread_the_emptiest() -> None:
    node = view([16 * GIB] * 3, {"a": shared_on(1, 40, 8), "b": shared_on(2, 80, 14)})
    demand = Demand(20, 4 * GIB, 0)
    assert place(node, demand, "binpack").assignment.shared[0] == gpu_uuid("n1", 1)
    assert place(node, demand, "spread").assignment.shared[0] == gpu_uuid("n1", 0)


def test_the_gpus_preferred_are_taken_where_they_still_fit_and_the_strategy_decides_else(
        ) -> None:
    node = view([16 * GIB] * 4, {"a": shared_on(1, 50, 4), "b": Assignment(None, (
        gpu_uuid("n1", 2),))})
    demand = Demand(30, 2 * GIB, 1)
    preferred = Assignment((gpu_uuid("n1", 0), 30, 2 * GIB), (gpu_uuid("n1", 3),))
    assert place(node, demand, "binpack").assignment != preferred  # binpack: GPUs 1 and 0
    assert place(node, demand, "binpack", preferred).assignment == preferred
    # 60% no longer fits on GPU 1, and GPU 2 is given whole: binpack's choice, as without.
    taken = Assignment((gpu_uuid("n1", 1), 60, 2 * GIB), (gpu_uuid("n1", 2),))
    assert place(node, Demand(60, 2 * GIB, 1), "binpack", taken).assignment == Assignment(
        (gpu_uuid("n1", 0), 60, 2 * GIB), (gpu_uuid("n1", 3),))


def test_binpack_scores_a_fuller_node_higher_and_spread_lower() -> None:
    empty, busy = view([16 * GIB] * 2), view([16 * GIB] * 2, {"a": shared_on(0, 50, 8)})
    demand = Demand(20, 4 * GIB, 0)
    assert place(busy, demand, "binpack").score > place(empty, demand, "binpack").score
    assert place(busy, demand, "spread").score < place(empty, demand, "spread").score


def test_a_gpu_given_whole_is_never_shared_and_a_shared_gpu_never_given_whole() -> None:
    whole = Assignment(None, (gpu_uuid("n1", 0),))
    node = view([16 * GIB] * 3, {"w": whole, "s": shared_on(1, 10, 1)})
    placement = place(node, Demand(10, GIB, 1), "binpack")
    assert placement.assignment.shared[0] == gpu_uuid("n1", 1)
    assert placement.assignment.whole == (gpu_uuid("n1", 2),)
    with pytest.raises(Unfit, match="2 whole GPUs wanted, 1 of 3 unused"):
        place(node, Demand(0, 0, 2))


def test_a_pod_with_a_share_and_whole_gpus_leaves_the_idle_gpus_to_its_whole_part() -> None:
    node = view([16 * GIB] * 3, {"s": shared_on(2, 10, 1)})
    placement = place(node, Demand(10, GIB, 2), "spread")
    assert placement.assignment.shared[0] == gpu_uuid("n1", 2)
    assert set(placement.assignment.whole) == {gpu_uuid("n1", 0), gpu_uuid("n1", 1)}


def test_a_stale_inventory_makes_the_node_unfit_for_good_with_its_age() -> None:
    with pytest.raises(Unfit, match="last published this node's GPUs 300 s ago "
                                    r"\(limit 120 s\)") as caught:
        view([16 * GIB], heartbeat=NOW - 300)
    assert caught.value.final


def test_a_node_without_inventory_says_the_node_agent_does_not_run_there() -> None:
    with pytest.raises(Unfit, match="the vcuda node agent does not run on this node"):
        node_gpus("n1", {}, NOW, 120)


def test_an_inventory_that_lists_a_gpu_twice_is_unreadable() -> None:
    node = node_object("n1", [GIB, GIB])
    annotations = node["metadata"]["annotations"]
    twice = json.loads(annotations[INVENTORY_ANNOTATION])
    twice["gpus"][1]["uuid"] = twice["gpus"][0]["uuid"]
    annotations[INVENTORY_ANNOTATION] = json.dumps(twice)
    with pytest.raises(Unfit, match="is listed twice") as raised:
        placement("n1", annotations, Demand(10, GIB, 0), "binpack", NOW, 120)
    assert raised.value.cause == UNREADABLE_INVENTORY


def test_a_malformed_ledger_is_named() -> None:
    node = node_object("n1", [GIB], annotations={LEDGER_ANNOTATION: "{"})
    with pytest.raises(Unfit, match=r"vcuda\.io/gpu-ledger is not JSON"):
        node_gpus("n1", node["metadata"]["annotations"], NOW, 120)


def test_binds_not_yet_in_the_ledger_count_and_the_pod_itself_does_not() -> None:
    node = node_object("n1", [16 * GIB])
    pending = [("other", shared_on(0, 60, 8)), ("self", shared_on(0, 30, 4))]
    gpus = node_gpus("n1", node["metadata"]["annotations"], NOW, 120, pending, ignore="self")
    assert (gpus.gpus[0].cores, gpus.gpus[0].memory) == (60, 8 * GIB)


def test_the_remembered_answer_is_the_computed_one_and_pending_binds_still_count() -> None:
    ledger = {"a": Entry("team/a", int(NOW), shared_on(0, 80, 8))}
    node = node_object("n1", [16 * GIB, 16 * GIB], annotations={LEDGER_ANNOTATION:
                                                                encode_ledger(ledger)})
    annotations = node["metadata"]["annotations"]
    demand = Demand(20, 4 * GIB, 0)
    computed = place(node_gpus("n1", annotations, NOW, 120), demand)
    for _ in range(2):  # the second answer comes from memory
        remembered = placement("n1", annotations, demand, "binpack", NOW, 120)
        assert (remembered.assignment, remembered.score) == (computed.assignment,
                                                             computed.score)
    pending = [("b", shared_on(0, 20, 4))]
    assert placement("n1", annotations, demand, "binpack", NOW, 120, pending).assignment \
        .shared[0] == gpu_uuid("n1", 1)
    with pytest.raises(Unfit, match="last published"):
        placement("n1", annotations, demand, "binpack", NOW + 600, 120)


def test_an_answer_outlives_a_heartbeat_and_not_a_change_of_gpus_or_freshness(
        monkeypatch: pytest.MonkeyPatch) -> None:
    computed = []
    monkeypatch.setattr(policy, "place", lambda *args: computed.append(args) or place(*args))
    ledger = {"a": Entry("team/a", int(NOW), shared_on(0, 70, 5))}
    demand = Demand(30, 3 * GIB, 0)  # a size no other test asks for: nothing remembered yet

    def annotations(heartbeat: float, memories: list[int]) -> dict[str, str]:
        node = node_object("n1", memories, heartbeat,
                           {LEDGER_ANNOTATION: encode_ledger(ledger)})
        return node["metadata"]["annotations"]

    first = placement("n1", annotations(NOW, [16 * GIB] * 2), demand, "binpack", NOW, 120)
    later = placement("n1", annotations(NOW + 30, [16 * GIB] * 2), demand, "binpack",
                      NOW + 30, 120)
    assert len(computed) == 1  # the agent's next pass changed the heartbeat only
    assert (later.assignment, later.score) == (first.assignment, first.score)
    assert first.assignment.shared[0] == gpu_uuid("n1", 0)
    smaller = placement("n1", annotations(NOW + 60, [7 * GIB, 16 * GIB]), demand, "binpack",
                        NOW + 60, 120)
    assert len(computed) == 2 and smaller.assignment.shared[0] == gpu_uuid("n1", 1)
    with pytest.raises(Unfit, match="last published"):
        placement("n1", annotations(NOW + 30, [16 * GIB] * 2), demand, "binpack", NOW + 600, 120)


def test_an_answer_is_remembered_for_what_the_ledger_and_binds_in_flight_give_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    computed = []
    monkeypatch.setattr(policy, "place", lambda *args: computed.append(args) or place(*args))
    node = node_object("n1", [16 * GIB, 16 * GIB])
    annotations = node["metadata"]["annotations"]
    demand = Demand(35, 3 * GIB, 0)  # a size no other test asks for: nothing remembered yet
    one = [("b", shared_on(0, 50, 4))]
    for _ in range(2):  # filter, then prioritize: one computation
        assert placement("n1", annotations, demand, "spread", NOW, 120, one).assignment \
            .shared[0] == gpu_uuid("n1", 1)
    assert len(computed) == 1
    two = [*one, ("c", shared_on(1, 60, 4))]  # another bind arrives: a new question
    assert placement("n1", annotations, demand, "spread", NOW, 120, two).assignment \
        .shared[0] == gpu_uuid("n1", 0)
    assert len(computed) == 2
    # The bind written: in the ledger and no longer pending, the same GPUs are given out.
    ledger = {"b": Entry("team/b", int(NOW), shared_on(0, 50, 4))}
    written = node_object("n1", [16 * GIB, 16 * GIB], annotations={
        LEDGER_ANNOTATION: encode_ledger(ledger)})["metadata"]["annotations"]
    assert placement("n1", written, demand, "spread", NOW, 120).assignment \
        .shared[0] == gpu_uuid("n1", 1)
    assert len(computed) == 2
    # The pod placed is never counted, though a bind of it is pending.
    itself = [*two, ("self", shared_on(0, 50, 4))]
    answer = placement("n1", annotations, demand, "spread", NOW, 120, itself, ignore="self")
    assert answer.assignment.shared[0] == gpu_uuid("n1", 0) and len(computed) == 2
    with pytest.raises(Unfit, match="no GPU has 35 percent"):
        placement("n1", annotations, demand, "spread", NOW, 120,
                  [*two, ("d", shared_on(0, 20, 1)), ("e", shared_on(1, 10, 1))])


def test_the_ledger_bind_writes_is_the_text_the_node_agent_writes_and_reads_back() -> None:
    entries = {
        "uid-b": Entry("team/b", NOW, Assignment((gpu_uuid("n", 1), 25, 3 * GIB), ())),
        "uid-a": Entry("team/a", NOW + 1, Assignment(None, (gpu_uuid("n", 0), gpu_uuid("n", 2)))),
        "uid-c": Entry("other/c-1", NOW, Assignment((gpu_uuid("n", 3), 10, GIB),
                                                   (gpu_uuid("n", 4),))),
    }
    text = ledger_text(entries)
    assert text == encode_ledger(entries)
    assert decode_ledger(text) == entries
    assert ledger_text({}) == encode_ledger({})


def _with_sharing(annotations: dict[str, str], **fields: int) -> dict[str, str]:
    """``annotations`` with each GPU of the inventory given ``fields`` (cores, sharers)."""
    body = json.loads(annotations[INVENTORY_ANNOTATION])
    for gpu in body["gpus"]:
        gpu.update(fields)
    return {**annotations, INVENTORY_ANNOTATION: json.dumps(body)}


def test_a_gpu_published_with_overcommit_takes_shares_up_to_its_cores() -> None:
    ledger = {"a": Entry("team/a", int(NOW), shared_on(0, 60, 1))}
    annotations = _with_sharing(node_object("n1", [16 * GIB], annotations={
        LEDGER_ANNOTATION: encode_ledger(ledger)})["metadata"]["annotations"], cores=120)
    node = node_gpus("n1", annotations, NOW, 120)
    assert place(node, Demand(60, GIB, 0)).assignment.shared[0] == gpu_uuid("n1", 0)
    with pytest.raises(Unfit, match=r"no GPU has 61 percent and 1 GiB free "
                                    r"\(GPU 0 has 60 percent and 15 GiB "):
        place(node, Demand(61, GIB, 0))


def test_a_gpu_with_its_cap_of_sharers_takes_no_more_and_says_so() -> None:
    ledger = {uid: Entry(f"team/{uid}", int(NOW), shared_on(0, 10, 1)) for uid in ("a", "b")}
    annotations = _with_sharing(node_object("n1", [16 * GIB], annotations={
        LEDGER_ANNOTATION: encode_ledger(ledger)})["metadata"]["annotations"], sharers=2)
    with pytest.raises(Unfit, match=r"^no GPU has 10 percent and 1 GiB free and room for one "
                                    r"more sharer "
                                    r"\(GPU 0 has 2 sharers, the most its node allows on one GPU, "
                                    r"the closest\)$"):
        place(node_gpus("n1", annotations, NOW, 120), Demand(10, GIB, 0))
    annotations = _with_sharing(annotations, sharers=3)
    assert place(node_gpus("n1", annotations, NOW, 120), Demand(10, GIB, 0)).assignment.shared


@pytest.mark.parametrize(("fields", "message"), [
    ({"cores": 99}, "cores 99 is not a whole number in 100..1000"),
    ({"cores": 1001}, "cores 1001 is not a whole number in 100..1000"),
    ({"sharers": -1}, "sharers -1 is not a whole number in 0..1000"),
    ({"sharers": True}, "sharers True is not a whole number in 0..1000"),
])
def test_an_inventory_with_cores_or_sharers_out_of_bounds_is_unreadable(
        fields: dict[str, object], message: str) -> None:
    annotations = _with_sharing(node_object("n1", [GIB])["metadata"]["annotations"], **fields)
    with pytest.raises(Unfit, match=message) as raised:
        placement("n1", annotations, Demand(10, GIB, 0), "binpack", NOW, 120)
    assert raised.value.cause == UNREADABLE_INVENTORY


def test_the_inventory_writes_cores_and_sharers_only_where_they_are_not_the_defaults() -> None:
    plain, shared = Gpu("GPU-a", 0, GIB), Gpu("GPU-b", 1, GIB, 150, 4)
    text = encode_inventory([plain, shared], int(NOW))
    assert json.loads(text)["gpus"] == [{"uuid": "GPU-a", "index": 0, "memory": GIB},
                                        {"uuid": "GPU-b", "index": 1, "memory": GIB,
                                         "cores": 150, "sharers": 4}]
    assert decode_inventory(text).gpus == (plain, shared)


def test_a_share_of_several_gpus_is_the_pods_need_on_each_of_them() -> None:
    pod = pod_object("p", cores=30, memory_gib=10, gpus=2)
    assert pod_demand(pod, CORE_KEYS) == Demand(30, 10 * GIB, 0, 2)


def test_a_two_gpu_share_is_placed_on_two_distinct_gpus_that_each_fit() -> None:
    node = view([16 * GIB, 16 * GIB])
    assignment = place(node, Demand(30, 10 * GIB, 0, 2)).assignment
    assert assignment.shared == (gpu_uuid("n1", 0), 30, 10 * GIB)
    assert assignment.shared_gpus() == (gpu_uuid("n1", 0), gpu_uuid("n1", 1))


def test_a_two_gpu_share_where_only_one_gpu_fits_is_unfit_saying_how_many_fit() -> None:
    node = view([16 * GIB, 16 * GIB], {"a": shared_on(1, 80, 2)})
    with pytest.raises(Unfit) as caught:
        place(node, Demand(30, 10 * GIB, 0, 2))
    assert caught.value.reason == ("2 GPUs with 30 percent and 10 GiB free each wanted, "
                                   "1 of 2 has it "
                                   "(GPU 1 has 20 percent and 14 GiB free, the closest)")
    assert "\n" not in caught.value.reason and not caught.value.final


def test_binpack_takes_the_fullest_gpus_for_a_two_gpu_share_and_spread_the_emptiest() -> None:
    node = view([16 * GIB] * 4, {"a": shared_on(1, 40, 8), "b": shared_on(2, 60, 4),
                                 "c": shared_on(3, 10, 1)})
    demand = Demand(20, 4 * GIB, 0, 2)
    by = {strategy: place(node, demand, strategy).assignment.shared_gpus()
          for strategy in ("binpack", "spread")}
    assert by["binpack"] == (gpu_uuid("n1", 2), gpu_uuid("n1", 1))
    assert by["spread"] == (gpu_uuid("n1", 0), gpu_uuid("n1", 3))


def test_a_two_gpu_share_in_the_ledger_counts_on_both_gpus_and_old_entries_still_read() -> None:
    two = Assignment((gpu_uuid("n1", 0), 60, 10 * GIB), (), (gpu_uuid("n1", 1),))
    node = view([16 * GIB] * 3, {"a": two})
    assert [(g.cores, g.memory, g.pods) for g in node.gpus] == [
        (60, 10 * GIB, 1), (60, 10 * GIB, 1), (0, 0, 0)]
    text = encode_ledger({"a": Entry("team/p", int(NOW), two)})
    assert json.loads(text)["pods"]["a"]["also_shared"] == [gpu_uuid("n1", 1)]
    assert decode_ledger(text)["a"].assignment == two
    old = '{"version":1,"pods":{"a":{"pod":"team/p","at":1,"shared":["GPU-x",30,1]}}}'
    assert decode_ledger(old)["a"].assignment == Assignment(("GPU-x", 30, 1), ())


@pytest.mark.parametrize(("also", "reason"), [
    ('["GPU-x"]', "a GPU of the share is listed twice"),
    ('"GPU-y"', "also_shared is not a list"),
])
def test_a_ledger_whose_share_of_several_gpus_is_malformed_is_refused_with_the_reason(
        also: str, reason: str) -> None:
    text = ('{"version":1,"pods":{"a":{"pod":"team/p","at":1,"shared":["GPU-x",30,1],'
            f'"also_shared":{also}}}}}}}')
    with pytest.raises(PlacementError, match=reason):
        decode_ledger(text)
