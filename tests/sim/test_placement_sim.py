"""The simulated cluster, small: every pod placed where a GPU can hold it and started on it."""

from __future__ import annotations

from tests.sim.placement import PARTS, Report, Scenario, run


def test_a_small_cluster_with_restarts_places_every_pod_on_a_gpu_that_holds_it() -> None:
    report: Report = run(Scenario(nodes=3, gpus_per_node=2, pods=90, burst=30,
                                  node_processes=2))
    assert report.started + report.never_placed == report.created  # no pod lost on the way
    assert report.started >= 40  # the rest wait for room: the offline check says none fits
    assert report.started_on_several_gpus > 0  # two-GPU shares placed, held in the checks below
    assert report.refused_at_start == []
    assert report.wrong_gpu == []
    assert report.over_committed == []
    assert report.shared_and_whole == []
    assert report.unschedulable_but_fit == []
    assert report.deleted > 0
    assert report.errors == []
    assert all(report.placing_cpu[part] > 0 for part in PARTS)  # each process was measured
    waited = report.cycle_per_pod()  # where the scheduler's time went, adding up to all of it
    assert waited["filter"] > 0 and waited["prioritize"] > 0
    assert abs(sum(waited.values()) - 1000 / report.rate()) < 0.1
