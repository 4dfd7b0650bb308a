"""The agent's metrics of DRA claims, scraped over HTTP: the claims prepared on each GPU (from the
node ledger) and the calls of kubelet that failed."""

from __future__ import annotations

import logging

from runtime_hook.node.logs import Problems
from runtime_hook.node.metrics import NodeCollector, serve
from runtime_hook.node.observe import Observer
from tests.dra.conftest import GPU0, GPU1, NODE, DraNode
from tests.node.workloads_on_host import Series, labels, scrape


def _scrape(node: DraNode) -> Series:
    problems = Problems(logging.getLogger("vcuda-node"), "metrics")
    observer = Observer(node.nvml, problems, "/", str(node.state_dir))
    server, _ = serve(NodeCollector(observer, NODE, problems, node.driver.claim_stats),
                      "127.0.0.1", 0)
    try:
        return scrape(server.server_port)
    finally:
        server.shutdown()
        server.server_close()


def _prepared(series: Series) -> dict[str, float]:
    return {dict(key)["uuid"]: value
            for key, value in series["vcuda_dra_prepared_claims"].items()}


def _failures(series: Series) -> dict[str, float]:
    return {dict(key)["call"]: value
            for key, value in series["vcuda_dra_claim_failures_total"].items()}


def test_each_gpu_counts_its_prepared_claims_and_unprepare_takes_them_off(
        dra_node: DraNode) -> None:
    # First fit: both shares land on GPU0; the whole-GPU claim takes GPU1.
    shares = [dra_node.claim(name, cores="20", memory="2Gi") for name in ("a", "b")]
    whole = dra_node.claim("whole")
    assert _prepared(_scrape(dra_node)) == {GPU0: 0, GPU1: 0}

    for claim in (*shares, whole):
        assert dra_node.kubelet.prepare(claim)[claim["metadata"]["uid"]].error == ""
    series = _scrape(dra_node)
    assert _prepared(series) == {GPU0: 2, GPU1: 1}
    assert series["vcuda_dra_prepared_claims"][labels(node=NODE, gpu="0", uuid=GPU0)] == 2

    dra_node.kubelet.unprepare(shares[0])
    assert _prepared(_scrape(dra_node)) == {GPU0: 1, GPU1: 1}


def test_failed_prepares_and_unprepares_are_counted_by_call(dra_node: DraNode) -> None:
    claim = dra_node.claim("moved", cores="10", memory="1Gi")
    stored = dra_node.api.get("/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/moved")
    del stored["status"]  # deallocated meanwhile: prepare cannot use it
    dra_node.api.add_claim(stored)
    odd = {"metadata": {**claim["metadata"], "uid": "../../state"}}
    assert _failures(_scrape(dra_node)) == {"prepare": 0, "unprepare": 0}

    dra_node.kubelet.prepare(claim)
    dra_node.kubelet.prepare(claim, odd)
    dra_node.kubelet.unprepare(odd)

    series = _scrape(dra_node)
    assert _failures(series) == {"prepare": 3, "unprepare": 1}
    assert _prepared(series) == {GPU0: 0, GPU1: 0}


def test_an_agent_without_dra_exports_no_claim_metrics(dra_node: DraNode) -> None:
    problems = Problems(logging.getLogger("vcuda-node"), "metrics")
    observer = Observer(dra_node.nvml, problems, "/", str(dra_node.state_dir))
    server, _ = serve(NodeCollector(observer, NODE, problems), "127.0.0.1", 0)
    try:
        series = scrape(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
    assert "vcuda_gpu_memory_total_bytes" in series
    assert not [name for name in series if name.startswith("vcuda_dra_")]
