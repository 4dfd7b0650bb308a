"""The Helm chart charts/vcuda: lint, every path rendered and validated strictly for every
supported Kubernetes version, the same objects as the kustomize path of the same name, any
namespace, and each combination it refuses with its message. helm is the one
scripts/build-helm built from its Go module."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.manifests import PATHS, kustomize, needs_kubectl
from tests.helm import CHART, helm_binary

VERSIONS = [f"1.{minor}.0" for minor in range(30, 38)]  # where kubernetes-validate has schemas
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
CONFIG_HASH = "vcuda.io/config-sha256"  # on the webhook's pods: an upgrade of it rolls them


def _template(*flags: str, version: str = "1.33.4",
              namespace: str = "vcuda-system") -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), "template", "vcuda", str(CHART), "-n", namespace,
                           "--kube-version", version, *flags],
                          capture_output=True, text=True, timeout=120, check=False)


def _objects(*flags: str, **options: str) -> list[dict[str, Any]]:
    rendered = _template(*flags, **options)
    assert rendered.returncode == 0, rendered.stderr
    return [d for d in yaml.safe_load_all(rendered.stdout) if d]


def _path_flags(path: str) -> list[str]:
    if path == "placement-self-managed":
        return ["--set", "path=placement", "--set", "placement.scheduler=self-managed"]
    return ["--set", f"path={path}"]


def test_the_chart_lints() -> None:
    linted = subprocess.run([helm_binary(), "lint", str(CHART), "--kube-version", "1.33.0"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", PATHS)
def test_every_path_renders_valid_objects_for_every_supported_version(path: str,
                                                                      version: str) -> None:
    if path == "dra" and version < "1.34":
        pytest.skip("the DRA path needs 1.34 (its refusal is tested below)")
    objects = _objects(*_path_flags(path), "--set", "networkPolicy.enabled=true",
                       "--set", "networkPolicy.from[0].ipBlock.cidr=10.0.0.0/8",
                       version=version)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


# --- one source: the chart installs what kustomize builds ------------------------------------

@needs_kubectl
def test_the_charts_files_are_what_the_kustomize_manifests_build_now() -> None:
    """scripts/render-chart wrote them; a change to manifests/ must be rendered again."""
    files = {"nvidia-device-plugin": "nvidia-device-plugin",
             "placement": "placement-second-scheduler",
             "placement-self-managed": "placement-self-managed", "dra": "dra"}
    for path, name in files.items():
        shipped = [d for d in yaml.safe_load_all((CHART / "files" / f"{name}.yaml").read_text())
                   if d]
        assert shipped == kustomize(PATHS[path]), f"run scripts/render-chart ({name})"


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what only Helm adds: its labels, the revision in the certificate Job's
    name, the hash of the webhook's settings on its pods; those settings as JSON values."""
    obj = json.loads(json.dumps(obj))
    labels = obj["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    if obj["kind"] == "Deployment":
        template = obj["spec"]["template"]["metadata"]
        template.get("annotations", {}).pop(CONFIG_HASH, None)
        if template.get("annotations") == {}:
            del template["annotations"]
    name, _, revision = obj["metadata"]["name"].rpartition("-")
    if obj["kind"] == "Job" and revision.isdigit():
        obj["metadata"]["name"] = name
    if obj["kind"] == "ConfigMap" and "config.json" in obj.get("data", {}):
        obj["data"]["config.json"] = json.loads(obj["data"]["config.json"])
    return obj


@needs_kubectl
@pytest.mark.parametrize("path", PATHS)
def test_the_chart_renders_the_objects_of_the_kustomize_path_of_the_same_name(
        path: str, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": [os.path.relpath(PATHS[path], tmp_path)],
        "images": [{"name": "registry.k8s.io/kube-scheduler", "newTag": "v1.34.2"}]}))
    built = [_comparable(o) for o in kustomize(tmp_path) if o["kind"] != "Namespace"]
    rendered = [_comparable(o) for o in _objects(*_path_flags(path), version="1.34.2")]
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    assert sorted(rendered, key=key) == sorted(built, key=key)


# --- values --------------------------------------------------------------------------------------

def _images(objects: list[dict[str, Any]]) -> set[str]:
    found = set()
    for obj in objects:
        spec = obj.get("spec", {})
        pod = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if pod:
            found |= {c["image"] for c in pod["spec"].get("initContainers", []) +
                      pod["spec"]["containers"]}
    return found


def test_kube_scheduler_follows_the_clusters_version_without_a_providers_suffix() -> None:
    objects = _objects("--set", "path=placement", version="1.35.3-gke.1200")
    assert "registry.k8s.io/kube-scheduler:v1.35.3" in _images(objects)


def test_the_image_is_taken_by_digest_when_one_is_given() -> None:
    digest = "sha256:" + "a" * 64
    images = _images(_objects("--set", "image.repository=registry.example/vcuda",
                              "--set", f"image.digest={digest}"))
    assert images == {f"registry.example/vcuda@{digest}"}


def test_any_namespace_holds_every_reference_to_it() -> None:
    objects = _objects("--set", "path=placement", namespace="gpu-ops")
    assert "vcuda-system" not in yaml.safe_dump_all(objects)
    [webhook] = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    [selector] = webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert selector["values"] == ["kube-system", "gpu-ops"]


def test_the_webhooks_settings_come_from_the_values() -> None:
    objects = _objects("--set", "domains={example.com}", "--set", "maxGpuMemory=141Gi")
    [config] = [o for o in objects if o["kind"] == "ConfigMap"]
    assert json.loads(config["data"]["config.json"]) == {"domains": ["example.com"],
                                                          "max_gpu_memory": "141Gi"}


def _webhook_policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects
            if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "vcuda-webhook"]


def test_a_change_of_the_webhooks_settings_rolls_its_pods() -> None:
    """The webhook reads its settings at start: its pods carry their hash, so that
    ``helm upgrade`` with other settings replaces them (tests/cluster/test_helm.py runs it)."""
    hashes = []
    for flags in ([], ["--set", "maxGpuMemory=8Gi"]):
        objects = _objects(*flags)
        [config] = [o for o in objects if o["kind"] == "ConfigMap"
                    and o["metadata"]["name"] == "vcuda-webhook-config"]
        [webhook] = [o for o in objects if o["kind"] == "Deployment"
                     and o["metadata"]["name"] == "vcuda-webhook"]
        hashes.append(webhook["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH])
        assert hashes[-1] == hashlib.sha256(config["data"]["config.json"].encode()).hexdigest()
    assert hashes[0] != hashes[1]


def test_the_webhooks_network_policy_is_off_by_default_and_takes_the_peers_given() -> None:
    assert _webhook_policies(_objects()) == []
    objects = _objects("--set", "networkPolicy.enabled=true",
                       "--set", "networkPolicy.from[0].ipBlock.cidr=192.0.2.10/32")
    [policy] = _webhook_policies(objects)
    api_server, prometheus = policy["spec"]["ingress"]
    assert api_server["from"] == [{"ipBlock": {"cidr": "192.0.2.10/32"}}]
    assert prometheus["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def test_the_prometheus_peer_of_the_webhooks_policy_follows_the_values() -> None:
    peers = ("--set", "networkPolicy.enabled=true",
             "--set", "networkPolicy.from[0].ipBlock.cidr=192.0.2.10/32")
    [policy] = _webhook_policies(_objects(
        *peers, "--set", "networkPolicy.prometheus.namespaceSelector.matchLabels.team=obs",
        "--set", "networkPolicy.prometheus.podSelector=null"))
    assert policy["spec"]["ingress"][1]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring",
                                               "team": "obs"}}}]
    [policy] = _webhook_policies(_objects(*peers, "--set", "networkPolicy.prometheus=null"))
    assert [r["from"] for r in policy["spec"]["ingress"]] == [
        [{"ipBlock": {"cidr": "192.0.2.10/32"}}]]


# --- refused -----------------------------------------

@pytest.mark.parametrize("flags,version,message", [
    (["--set", "path=dra"], "1.33.4",
     "vcuda: path dra needs Kubernetes 1.34 or later (resource.k8s.io/v1); this cluster is "
     "v1.33.4: use path nvidia-device-plugin or placement"),
    (["--set", "path=placement", "--set", "placement.kubeScheduler.tag=v1.35.0"], "1.33.4",
     "vcuda: placement.kubeScheduler.tag v1.35.0 does not fit this cluster (v1.33.4): "
     "kube-scheduler may be the API server's minor version or one older"),
    (["--set", "path=placement", "--set", "placement.kubeScheduler.tag=v1.31.0"], "1.33.4",
     "vcuda: placement.kubeScheduler.tag v1.31.0 does not fit this cluster (v1.33.4)"),
    (["--set", "networkPolicy.enabled=true"], "1.33.4",
     "vcuda: networkPolicy.enabled needs networkPolicy.from: the peers from which the API "
     "server reaches the webhook"),
    (["--set", "placement.scheduler=self-managed"], "1.33.4",
     "vcuda: placement.scheduler self-managed is for path placement, not nvidia-device-plugin"),
], ids=["dra-before-1.34", "scheduler-newer", "scheduler-two-older", "policy-without-peers",
        "scheduler-without-placement"])
def test_a_combination_that_cannot_work_is_refused_with_what_to_do(
        flags: list[str], version: str, message: str) -> None:
    rendered = _template(*flags, version=version)
    assert rendered.returncode != 0
    assert message in rendered.stderr


def test_a_kube_scheduler_one_minor_older_is_accepted() -> None:
    _objects("--set", "path=placement", "--set", "placement.kubeScheduler.tag=v1.32.9")
