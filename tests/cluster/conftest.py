"""The real one-node cluster of ``scripts/cluster``, up once for these tests and down after
them; skipped only where this machine cannot hold it (not root, no Go to build Kubernetes)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.kube import Cluster

REPO = Path(__file__).resolve().parents[2]
_SCRIPT = REPO / "scripts" / "cluster"


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the cluster's kubelet, cgroups and bridge need root"
    built = subprocess.run([str(REPO / "scripts" / "build-upstream"), "--print"],
                           capture_output=True, check=False).returncode == 0
    if not built and not shutil.which("go"):
        return "Kubernetes is built from its Go modules: install Go (tests/cluster/upstream)"
    return None


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    """``scripts/cluster up`` once for tests/cluster; ``down`` after its last test, whatever
    happened, so that the rest of the suite runs on a machine without it."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    try:
        started = subprocess.run([str(_SCRIPT), "up"], stdout=subprocess.PIPE, text=True,
                                 timeout=1800, check=False)
        assert started.returncode == 0, f"scripts/cluster up failed:\n{started.stdout}"
        kubeconfig = Path(started.stdout.strip().splitlines()[-1])
        yield Cluster(kubeconfig, kubeconfig.parent / "bin" / "kubectl")
    finally:
        subprocess.run([str(_SCRIPT), "down"], timeout=300, check=False)
