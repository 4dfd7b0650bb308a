"""``scripts/cluster``'s refusals, which need no cluster: a mode it cannot install, and a
restart of a component that is not running."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cluster.vcuda import REPO


def _cluster(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "scripts" / "cluster"), *args], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, "VCUDA_CLUSTER_DIR": str(state)})


def test_up_refuses_a_mode_it_cannot_install_and_names_those_it_can(tmp_path: Path) -> None:
    refused = _cluster(tmp_path, "up", "--with-vcuda", "dra")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "cluster: --with-vcuda dra is not supported yet: only device-plugin, placement, "
        "placement/self-managed (DRA comes with its own stand-ins)")
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_restart_of_a_component_that_is_not_running_says_so(tmp_path: Path) -> None:
    refused = _cluster(tmp_path, "restart", "kubelet")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (f"cluster: kubelet is not running here ({tmp_path}): "
                                      "scripts/cluster status")
