"""vcuda installed on the real cluster as README "Install" says (tests/cluster/vcuda.py): its
pods, its certificate, the node's resources, and the node agent's policy."""

from __future__ import annotations

import json

from tests.cluster.kube import Cluster
from tests.cluster.vcuda import GPUS_MIB, NAMESPACE

NODE = "vcuda-test-node"


def test_every_vcuda_pod_is_ready(vcuda: Cluster) -> None:
    pods = vcuda.get("pods", "-n", NAMESPACE)["items"]
    running = [p for p in pods if p["status"]["phase"] != "Succeeded"]
    names = sorted(p["metadata"]["name"].rsplit("-", 1)[0] for p in running)
    assert len([n for n in names if n.startswith("vcuda-webhook")]) == 2
    assert not [n for n in names if n.startswith("vcuda-scheduler")]  # placement's only
    assert len([n for n in names if n.startswith("vcuda-node")]) == 1
    for pod in running:
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"]
        assert ready == "True", pod["metadata"]["name"]


def test_the_certificate_job_made_the_secret_and_set_the_webhooks_ca_bundle(
        vcuda: Cluster) -> None:
    """What the Job made: the serving Secret, and its CA in the webhook configuration."""
    secret = vcuda.get("secret", "vcuda-webhook-tls", "-n", NAMESPACE)["data"]
    webhook = vcuda.get("mutatingwebhookconfiguration", "vcuda-webhook")
    bundles = [w["clientConfig"].get("caBundle", "") for w in webhook["webhooks"]]
    assert bundles == [secret["ca.crt"]]


def test_the_node_advertises_vcuda_resources_of_its_two_gpus(vcuda: Cluster) -> None:
    vcuda.ok("wait", f"node/{NODE}", "--timeout=60s",
             "--for=jsonpath={.status.allocatable.docker\\.com/vcuda-core}=200")
    allocatable = vcuda.get("node", NODE)["status"]["allocatable"]
    assert allocatable["nvidia.com/gpu.shared"] == "200"  # NVIDIA's plugin's stand-in
    # 256 MiB units of both GPUs' memory
    assert allocatable["docker.com/vcuda-memory"] == str(sum(GPUS_MIB) // 256)
    assert "nvidia.com/gpu" not in allocatable  # time-slicing renames it away


def _agent_token(vcuda: Cluster) -> str:
    """A token of the node agent's account bound to its pod, as the DaemonSet's pod has."""
    pod = vcuda.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vcuda-node")
    name = pod["items"][0]["metadata"]["name"]
    return vcuda.ok("create", "token", "vcuda-node", "-n", NAMESPACE, "--bound-object-kind",
                    "Pod", "--bound-object-name", name).strip()


def test_the_node_agents_own_token_cannot_patch_another_node(vcuda: Cluster) -> None:
    other = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "vcuda-other-node"}}
    vcuda.ok("apply", "-f", "-", stdin=json.dumps(other))
    try:
        token = _agent_token(vcuda)
        patch = json.dumps({"metadata": {"labels": {"vcuda.io/test": "x"}}})
        own = vcuda.as_token(token, "patch", "node", NODE, "-p", patch)
        assert own.returncode == 0, own.stderr  # its own node: allowed
        denied = vcuda.as_token(token, "patch", "node", "vcuda-other-node", "-p",
                               patch)
        assert denied.returncode != 0
        assert (f"the vcuda node agent of node {NODE} may change only that node, "
                "not vcuda-other-node") in denied.stderr
    finally:
        vcuda.ok("delete", "node", "vcuda-other-node", "--ignore-not-found")
        vcuda.ok("label", "node", NODE, "vcuda.io/test-")
