"""The real one-node cluster of ``scripts/cluster``, up once for these tests and down after
them, with vcuda installed on it (``--with-vcuda device-plugin``) where podman can build its
image; skipped only where this machine cannot hold it (not root, no Go to build Kubernetes)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.kube import Cluster
from tests.podman import require_podman
from tests.upstream import upstream_bin

REPO = Path(__file__).resolve().parents[2]
_SCRIPT = REPO / "scripts" / "cluster"


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the cluster's kubelet, cgroups and bridge need root"
    if upstream_bin() is None and not shutil.which("go"):
        return "Kubernetes is built from its Go modules: install Go (tests/cluster/upstream)"
    return None


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    """``scripts/cluster up`` once for tests/cluster; ``down`` after its last test, whatever
    happened, so that the rest of the suite runs on a machine without it. With
    VCUDA_CLUSTER_KUBECONFIG set, the cluster already up of that admin kubeconfig (left up)."""
    given = os.environ.get("VCUDA_CLUSTER_KUBECONFIG")
    if given:
        kubeconfig = Path(given)
        handle = Cluster(kubeconfig, kubeconfig.parent / "bin" / "kubectl")
        installed = handle.kubectl("get", "namespace", "vcuda-system").returncode == 0
        yield Cluster(kubeconfig, handle.kubectl_path, installed)
        return
    reason = _missing()
    if reason:
        pytest.skip(reason)
    with_vcuda = shutil.which("podman") is not None
    try:
        # VCUDA_KUBERNETES_VERSION (X.Y.Z) runs the suite on a release other than the default.
        version = os.environ.get("VCUDA_KUBERNETES_VERSION")
        started = subprocess.run([str(_SCRIPT), "up", *(["--version", version] if version else []),
                                  *(["--with-vcuda", "device-plugin"] if with_vcuda else [])],
                                 stdout=subprocess.PIPE, text=True, timeout=1800, check=False)
        assert started.returncode == 0, f"scripts/cluster up failed:\n{started.stdout}"
        kubeconfig = Path(started.stdout.strip().splitlines()[-1])
        yield Cluster(kubeconfig, kubeconfig.parent / "bin" / "kubectl", with_vcuda)
    finally:
        subprocess.run([str(_SCRIPT), "down"], timeout=300, check=False)


@pytest.fixture(scope="package")
def vcuda(cluster: Cluster) -> Cluster:
    """The cluster, with vcuda installed on it as README "Install" says."""
    if not cluster.with_vcuda:
        require_podman("to build the image that vcuda is installed from")
    return cluster
