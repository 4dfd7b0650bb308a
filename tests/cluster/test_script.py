"""``scripts/cluster``'s refusals, which need no cluster: a mode it cannot install, and a
restart of a component that is not running; an ``up`` after a cluster that was killed
without ``down``, with two clusters of its own; and the feature gates each release gets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.vcuda import REPO
from tests.test_scripts import script


def _cluster(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "scripts" / "cluster"), *args], capture_output=True,
                          text=True, timeout=600, check=False,
                          env={**os.environ, "VCUDA_CLUSTER_DIR": str(state)})


def test_up_refuses_a_mode_it_cannot_install_and_names_those_it_can(tmp_path: Path) -> None:
    refused = _cluster(tmp_path, "up", "--with-vcuda", "mig")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "cluster: --with-vcuda mig is not a mode: one of device-plugin, placement, "
        "placement/self-managed, dra")
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_restart_of_a_component_that_is_not_running_says_so(tmp_path: Path) -> None:
    refused = _cluster(tmp_path, "restart", "kubelet")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (f"cluster: kubelet is not running here ({tmp_path}): "
                                      "scripts/cluster status")


def _kill(state: Path) -> None:
    """SIGKILL every process group the cluster of ``state`` started, as a machine's stop
    does: nothing of ``down`` runs."""
    pids = [int(pid_file.read_text()) for pid_file in (state / "pids").iterdir()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(_running(pid) for pid in pids):
        assert time.monotonic() < deadline, "the killed cluster's processes did not end"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.usefixtures("no_cluster")
def test_up_after_a_killed_cluster_removes_what_it_left_and_refuses_while_one_runs(
        tmp_path: Path) -> None:
    killed, following = tmp_path / "a", tmp_path / "b"  # short: containerd's socket is in it
    assert _cluster(killed, "up").returncode == 0
    _kill(killed)
    try:
        started = _cluster(following, "up")
        assert started.returncode == 0, started.stdout + started.stderr
        assert started.stdout.splitlines()[0] == (
            f"cluster: the cluster of {killed} ended without scripts/cluster down (none of its "
            "processes runs): removing what it left")
        assert not (killed / "pids").exists()
        assert started.stdout.splitlines()[-1] == str(following / "admin.kubeconfig")
        assert _cluster(following, "status").stdout.startswith(f"cluster: up ({following})")
        again = _cluster(following, "up")
        assert (again.returncode, again.stderr.strip()) == (
            1, f"cluster: a cluster is up from {following}: scripts/cluster down first")
        other = _cluster(killed, "up")
        assert (other.returncode, other.stderr.strip()) == (
            1, f"cluster: a cluster is up from {following}: scripts/cluster down with "
               f"VCUDA_CLUSTER_DIR={following} first")
    finally:
        _cluster(following, "down")
        _cluster(killed, "down")
    assert not Path("/sys/class/net/vcuda0").exists() and not Path("/run/vcuda-cluster").exists()


@pytest.mark.usefixtures("no_cluster")
def test_up_refuses_while_another_program_listens_on_etcds_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # etcd's may be in TIME_WAIT
        taken.bind(("127.0.0.1", 2379))
        taken.listen()
        refused = _cluster(tmp_path, "up")
    assert (refused.returncode, refused.stderr.strip()) == (
        1, "cluster: something else listens on port 2379, which the apiserver and etcd need: "
           "stop it first")
    assert not Path("/sys/class/net/vcuda0").exists()


@pytest.mark.parametrize(("release", "flags"), [
    ("1.30.14", []), ("1.33.4", []),
    ("1.34.4", ["--feature-gates=DRAConsumableCapacity=true"]),
    ("1.35.0", ["--feature-gates=DRAConsumableCapacity=true"]),
    ("1.36.1", []), ("1.37.2", []),  # beta and on by default
])
def test_the_test_cluster_turns_on_consumable_capacity_where_it_is_off_by_default(
        release: str, flags: list[str]) -> None:
    cluster = script("cluster")
    assert cluster._gate_flags(release) == flags
    kubelet = json.loads(cluster._kubelet_config(Path("/pki"), release))
    assert kubelet.get("featureGates", {}) == ({"DRAConsumableCapacity": True} if flags else {})
