"""Admission of pods through the real apiserver: the webhook's mutation and denials as kubectl
shows them, the CEL matchConditions that keep other pods away from it, and its failurePolicy."""

from __future__ import annotations

import json

import pytest

from tests.cluster.kube import Cluster
from tests.cluster.vcuda import NAMESPACE
from tests.cri.images import BUSYBOX_IMAGE


def pod(name: str, limits: dict[str, str] | None = None, namespace: str = "default",
        **container: object) -> str:
    """A pod of one busybox container with these resource limits."""
    main: dict[str, object] = {"name": "main", "image": BUSYBOX_IMAGE,
                               "imagePullPolicy": "Never", "command": ["sleep", "3600"],
                               **container}
    if limits is not None:
        main["resources"] = {"limits": limits}
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": namespace},
                       "spec": {"restartPolicy": "Never", "containers": [main]}})


SHARE = {"docker.com/vcuda-core": "50", "docker.com/vcuda-memory": "8"}


def _reviews(vcuda: Cluster) -> int:
    """Reviews the webhook's pods answered."""
    pods = vcuda.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vcuda-webhook")
    return sum(vcuda.webhook_reviews(item["metadata"]["name"]) for item in pods["items"])


def test_a_vcuda_pod_comes_back_mutated(vcuda: Cluster) -> None:
    created = json.loads(vcuda.ok("create", "--dry-run=server", "-o", "json", "-f", "-",
                                  stdin=pod("mutated", SHARE)))
    spec = created["spec"]
    assert spec["runtimeClassName"] == "vcuda"
    assert spec["nodeSelector"] == {"vcuda.io/enabled": "true"}  # the RuntimeClass's
    limits = spec["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu.shared"] == "1"
    assert spec["containers"][0]["securityContext"]["seccompProfile"] == {
        "type": "RuntimeDefault"}
    assert "vcuda.io/limits" in created["metadata"]["annotations"]


def test_an_invalid_request_is_denied_with_the_webhooks_fix_in_kubectls_output(
        vcuda: Cluster) -> None:
    result = vcuda.kubectl("create", "--dry-run=server", "-f", "-",
                           stdin=pod("invalid", {"docker.com/vcuda-core": "50"}))
    assert result.returncode != 0
    assert 'admission webhook "' in result.stderr and "denied the request" in result.stderr
    assert ("docker.com/vcuda-core: 50 shares a GPU, so docker.com/vcuda-memory is required; "
            "add docker.com/vcuda-memory: N in units of 256 MiB (40 = 10 GiB)") in result.stderr


@pytest.mark.parametrize("resource", ["nvidia.com/gpu.shared", "vcuda.io/shared-gpu"])
def test_a_shared_gpu_resource_asked_directly_is_denied(vcuda: Cluster, resource: str) -> None:
    result = vcuda.kubectl("create", "--dry-run=server", "-f", "-",
                           stdin=pod("direct", {resource: "1"}))
    assert result.returncode != 0
    assert "denied the request" in result.stderr and resource in result.stderr


def test_kube_system_pods_and_pods_without_vcuda_never_reach_the_webhook(
        vcuda: Cluster) -> None:
    before = _reviews(vcuda)
    for name, namespace, limits in [("plain", "default", {"memory": "64Mi"}),
                                    ("system", "kube-system", SHARE)]:
        vcuda.ok("create", "--dry-run=server", "-f", "-",
                 stdin=pod(name, limits, namespace=namespace))
    assert _reviews(vcuda) == before
    vcuda.ok("create", "--dry-run=server", "-f", "-", stdin=pod("counted", SHARE))
    # The apiserver reviews a vcuda pod twice: once the webhook set runtimeClassName, the
    # RuntimeClass admission plugin, run again, adds the class's nodeSelector and
    # tolerations, so reinvocationPolicy IfNeeded calls the webhook again (its answer:
    # nothing to change).
    assert _reviews(vcuda) == before + 2


def test_with_every_webhook_pod_gone_vcuda_pods_are_denied_and_others_admitted(
        vcuda: Cluster) -> None:
    deployment = "deployment/vcuda-webhook"
    vcuda.ok("scale", "-n", NAMESPACE, deployment, "--replicas=0")
    try:
        vcuda.ok("wait", "-n", NAMESPACE, "pods", "-l", "app.kubernetes.io/name=vcuda-webhook",
                 "--for=delete", "--timeout=120s")
        denied = vcuda.kubectl("create", "--dry-run=server", "-f", "-",
                               stdin=pod("unreviewed", SHARE))
        assert denied.returncode != 0
        assert 'failed calling webhook "' in denied.stderr
        vcuda.ok("create", "--dry-run=server", "-f", "-", stdin=pod("plain", {"memory": "64Mi"}))
    finally:
        vcuda.ok("scale", "-n", NAMESPACE, deployment, "--replicas=2")
        vcuda.ok("rollout", "status", "-n", NAMESPACE, deployment, "--timeout=180s")
