"""The alert rules and the monitoring kustomization, checked by Prometheus' own promtool: the
rules parse, and each alert fires on series shaped like vcuda's and stays quiet otherwise."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.monitoring.conftest import MONITORING, alerts, dashboard, promtool, rule_groups

HERE = Path(__file__).resolve().parent


def _rule_file(directory: Path) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    return path


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    result = promtool("check", "rules", str(_rule_file(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups()['groups'])} rules found" \
        in result.stdout


def test_each_alert_fires_on_series_like_vcudas_and_only_then(tmp_path: Path) -> None:
    _rule_file(tmp_path)
    shutil.copy(HERE / "rules_test.yaml", tmp_path)
    result = promtool("test", "rules", str(tmp_path / "rules_test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not() -> None:
    cases = yaml.safe_load((HERE / "rules_test.yaml").read_text())["tests"]
    checks = [check for case in cases for check in case["alert_rule_test"]]
    fired = {c["alertname"] for c in checks if c["exp_alerts"]}
    quiet = {c["alertname"] for c in checks if not c["exp_alerts"]}
    named = {alert["alert"] for alert in alerts()}
    assert fired == named
    assert quiet == named


def test_every_alert_says_how_bad_and_what_to_do() -> None:
    for alert in alerts():
        assert alert["labels"]["severity"] in ("warning", "critical"), alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl kustomize builds it")
def test_the_kustomization_builds_the_monitors_the_rule_and_the_dashboard() -> None:
    built = subprocess.run(["kubectl", "kustomize", str(MONITORING)], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    objects = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(built)}
    assert set(objects) == {
        ("ServiceMonitor", "vcuda-webhook"), ("PodMonitor", "vcuda-node"),
        ("PodMonitor", "vcuda-scheduler-extender"), ("PrometheusRule", "vcuda"),
        ("ConfigMap", "vcuda-grafana-dashboard")}
    for found in objects.values():
        assert found["metadata"]["namespace"] == "vcuda-system"
        assert found["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vcuda"
    config_map = objects["ConfigMap", "vcuda-grafana-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["vcuda.json"]) == dashboard()
