"""README "Install" with Helm, then "Upgrade" and "Uninstall" as it says, on the real cluster
(NVIDIA's device plugin path): the chart's webhook admits a share and its container starts
with its limits; an upgrade with other webhook settings reaches the running webhook; the
uninstall gives the node back as the kustomize one does. The test ends with the kustomize
install the tests after it expect; a failure takes the cluster down."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.cluster import placement as p
from tests.cluster.conftest import Clusters
from tests.cluster.kube import Cluster
from tests.cluster.uninstall import NODE, assert_given_back, uninstall
from tests.cluster.vcuda import BEFORE_INSTALL, NAMESPACE, wait_ready
from tests.helm import CHART, helm_binary

BIG = p.share(10, 10)  # 10 GiB: admitted until maxGpuMemory is 8Gi


def _helm(cluster: Cluster, *args: str) -> str:
    done = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, KUBECONFIG=str(cluster.kubeconfig)), check=False)
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done.stdout


def _admitted(cluster: Cluster, pod: dict) -> tuple[bool, str]:
    """Whether the API server (the webhook included) admits ``pod``, stored nowhere."""
    done = cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    return done.returncode == 0, done.stderr


def test_helm_install_upgrade_and_uninstall_as_the_readme_says(
        clusters: Clusters, vcuda: Cluster, tmp_path: Path) -> None:
    helm_binary()  # skips before anything is undone where helm is not built
    state = vcuda.kubeconfig.parent
    before = json.loads((state / BEFORE_INSTALL).read_text())
    install = state / "vcuda-overlay"
    image = vcuda.vcuda_image()
    repository, tag = image.rsplit(":", 1)
    try:
        vcuda.ok("delete", "-k", str(install), "--wait=true", timeout=600)
        # README "Install", step 3, with Helm
        vcuda.ok("create", "namespace", NAMESPACE)
        vcuda.ok("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
        _helm(vcuda, "install", "vcuda", str(CHART), "-n", NAMESPACE,
              "--set", f"image.repository={repository}", "--set", f"image.tag={tag}")
        wait_ready(vcuda.kubectl, "device-plugin", NODE)
        p.create(vcuda, p.pod("helm-share", image, p.share(10, 2)))
        p.wait_running(vcuda, "helm-share")
        assert p.cuda_total(vcuda, "helm-share") == 2 << 30
        assert _admitted(vcuda, p.pod("helm-big", image, BIG)) == (True, "")

        # README "Upgrade", with other webhook settings: the webhook's pods are replaced
        _helm(vcuda, "upgrade", "vcuda", str(CHART), "-n", NAMESPACE, "--reuse-values",
              "--set", "maxGpuMemory=8Gi")
        wait_ready(vcuda.kubectl, "device-plugin", NODE)
        admitted, refusal = _admitted(vcuda, p.pod("helm-big", image, BIG))
        assert not admitted
        assert "docker.com/vcuda-memory: 40 (10 GiB) is more than the largest GPU (8 GiB); " \
               "write at most 32" in refusal, refusal
        assert vcuda.get("pod", "helm-share", "-n", "default")["status"]["phase"] == "Running"
        p.delete(vcuda, "helm-share")

        # README "Uninstall", step 3 with Helm
        log = uninstall(vcuda, tmp_path, lambda: _helm(vcuda, "uninstall", "vcuda", "-n",
                                                        NAMESPACE, "--wait"))
        assert '"uninstalled"' in log, log
        assert _helm(vcuda, "list", "-n", NAMESPACE, "-q").strip() == ""
        vcuda.ok("delete", "namespace", NAMESPACE, "--wait=true", timeout=300)
        assert_given_back(vcuda, before)

        vcuda.ok("apply", "-k", str(install))
        vcuda.ok("label", "node", NODE, "vcuda.io/enabled=true")
        wait_ready(vcuda.kubectl, "device-plugin", NODE)
    except BaseException:
        clusters.down()
        raise
