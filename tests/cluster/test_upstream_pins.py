"""The Go modules that pin each upstream release tests/cluster runs (scripts/pin-upstream
writes them, scripts/build-upstream builds them): each is whole and agrees with itself.
No cluster is started here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.upstream import REPO

UPSTREAM = REPO / "tests" / "cluster" / "upstream"
PINNED = sorted([UPSTREAM / "go.mod", *UPSTREAM.glob("*/go.mod")])
COMMANDS = {"kube-apiserver", "kube-controller-manager", "kube-proxy", "kube-scheduler",
            "kubectl", "kubelet"}


def _release(go_mod: Path) -> str:
    found = re.search(r"^\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+)\b", go_mod.read_text(), re.M)
    assert found, f"{go_mod} requires no released k8s.io/kubernetes"
    return found.group(1)


def test_the_default_and_the_older_releases_are_pinned() -> None:
    minors = {_release(m).rsplit(".", 1)[0] for m in PINNED}
    assert {"v1.30", "v1.34"} <= minors and len(minors) == len(PINNED)


@pytest.mark.parametrize("go_mod", PINNED, ids=lambda m: _release(m))
def test_each_staging_module_is_replaced_by_the_one_published_with_its_release(
        go_mod: Path) -> None:
    text = go_mod.read_text()
    staging = dict(re.findall(r"^\s*(k8s\.io/[\w.-]+) => \1 (v\S+)$", text, re.M))
    release = _release(go_mod)
    assert staging and set(staging.values()) == {"v0." + release.split(".", 1)[1]}
    assert {"k8s.io/api", "k8s.io/apiserver", "k8s.io/kubelet"} <= staging.keys()
    tools = set(re.search(r"^tool \(\n(.*?)^\)", text, re.M | re.S).group(1).split())
    assert tools == {f"k8s.io/kubernetes/cmd/{c}" for c in COMMANDS} | {
        "go.etcd.io/etcd/server/v3"}
    assert (go_mod.parent / "go.sum").is_file()


def test_a_release_not_pinned_is_refused_naming_the_pinned_ones() -> None:
    asked = subprocess.run([str(REPO / "scripts" / "build-upstream"), "--version", "1.29",
                            "--print"], capture_output=True, text=True, check=False)
    assert asked.returncode == 1
    assert "build-upstream: Kubernetes 1.29 is not pinned" in asked.stderr
    assert "1.30 1.34" in asked.stderr and "scripts/pin-upstream 1.29.Z pins it" in asked.stderr


@pytest.mark.parametrize("flag", [["--version"], ["--version", "1.30.1"], ["--bogus"]])
def test_a_malformed_flag_gets_the_usage(flag: list[str]) -> None:
    asked = subprocess.run([str(REPO / "scripts" / "build-upstream"), *flag],
                           capture_output=True, text=True, check=False)
    assert asked.returncode == 2 and asked.stderr.startswith("usage: scripts/build-upstream")


def test_kwok_is_pinned_as_a_tool_and_its_build_takes_no_release() -> None:
    go_mod = (REPO / "tests" / "cluster" / "kwok" / "go.mod").read_text()
    assert re.search(r"^tool sigs\.k8s\.io/kwok/cmd/kwok$", go_mod, re.M)
    assert re.search(r"^\tsigs\.k8s\.io/kwok v\d+\.\d+\.\d+ ", go_mod, re.M)
    assert (REPO / "tests" / "cluster" / "kwok" / "go.sum").is_file()
    asked = subprocess.run([str(REPO / "scripts" / "build-upstream"), "--kwok", "--version",
                            "1.34"], capture_output=True, text=True, check=False)
    assert asked.returncode == 2 and asked.stderr.startswith("usage: scripts/build-upstream")
