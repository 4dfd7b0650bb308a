"""The upstream cluster itself: what every vcuda test on it relies on."""

from __future__ import annotations

import json

from tests.cluster.kube import Cluster
from tests.cri.images import BUSYBOX_IMAGE


def _pod(name: str, command: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
            "command": ["sh", "-c", command]}]},
    })


def test_the_servers_version_is_the_pinned_release(cluster: Cluster) -> None:
    version = json.loads(cluster.ok("version", "-o", "json"))
    pinned = cluster.kubeconfig.parent.joinpath("bin").resolve().parent.name.split("-")[0]
    assert version["serverVersion"]["gitVersion"] == f"v{pinned}"
    assert version["clientVersion"]["gitVersion"] == f"v{pinned}"


def test_a_plain_pod_runs_to_completion_through_scheduler_kubelet_and_containerd(
        cluster: Cluster) -> None:
    cluster.ok("apply", "-f", "-", stdin=_pod("plain", "echo hello from $(hostname)"))
    try:
        cluster.ok("wait", "pod/plain", "--for=jsonpath={.status.phase}=Succeeded",
                   "--timeout=120s")
        pod = cluster.get("pod", "plain")
        assert pod["spec"]["nodeName"] == "vcuda-test-node"  # bound by kube-scheduler
        assert pod["status"]["podIP"].startswith("10.244.0.")  # on the bridge's network
        assert cluster.ok("logs", "plain") == "hello from plain\n"  # kubelet, via the apiserver
    finally:
        cluster.ok("delete", "pod", "plain", "--wait=true")
