"""What the monitoring tests share: the shipped files, and promtool."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run Prometheus' promtool (Debian's prometheus package, which scripts/setup installs)."""
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: run scripts/setup (Debian's package prometheus)")
    return subprocess.run(["promtool", *args], input=stdin, capture_output=True, text=True,
                          timeout=120, check=False)


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec: the groups, as a Prometheus rule file holds them."""
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    return rule["spec"]


def alerts() -> list[dict[str, Any]]:
    return [r for group in rule_groups()["groups"] for r in group["rules"] if "alert" in r]


def dashboard() -> dict[str, Any]:
    return json.loads((MONITORING / "dashboard.json").read_text())
