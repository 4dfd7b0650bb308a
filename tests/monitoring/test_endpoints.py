"""Each component's real /metrics passes promtool's checks, and every metric the alert rules
and the dashboard name is one that some component serves."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.monitoring import endpoints
from tests.monitoring.conftest import alerts, dashboard, promtool
from tests.monitoring.promql import label_values_metric, metric_names

COMPONENTS: dict[str, Callable[[Path], str]] = {
    "webhook": endpoints.webhook, "extender": endpoints.extender, "node": endpoints.node}
PROMETHEUS_OWN = {"up"}  # the scrape's own series, by the monitors' job names
# The names a family of each type is stored under, beside the samples it serves now.
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
             "summary": ("_sum", "_count")}


@pytest.fixture(scope="module")
def expositions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("the node agent's containers are pid namespaces, which need root")
    return {name: scrape(tmp_path_factory.mktemp(name)) for name, scrape in COMPONENTS.items()}


def _served(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


@pytest.mark.parametrize("component", COMPONENTS)
def test_promtool_accepts_each_components_metrics(expositions: dict[str, str],
                                                 component: str) -> None:
    result = promtool("check", "metrics", stdin=expositions[component])
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert "vcuda_build_info{" in expositions[component]


def _dashboard_queries() -> list[tuple[str, set[str]]]:
    found = []
    panels = dashboard()["panels"]
    for panel in [*panels, *(p for row in panels for p in row.get("panels", []))]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r}", metric_names(target["expr"])))
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            found.append((f"variable {variable['name']!r}", label_values_metric(query)))
    return found


def test_every_metric_of_the_rules_and_the_dashboard_is_served(
        expositions: dict[str, str]) -> None:
    served = set().union(*map(_served, expositions.values())) | PROMETHEUS_OWN
    queries = [(f"alert {a['alert']}", metric_names(a["expr"])) for a in alerts()]
    queries += _dashboard_queries()
    missing = {(where, name) for where, names in queries for name in names if name not in served}
    assert not missing
    named = {name for _, names in queries for name in names}
    assert {"vcuda_node_refused_starts_total", "vcuda_container_memory_driver_bytes",
            "vcuda_webhook_review_seconds_bucket", "vcuda_extender_requests_total"} <= named
