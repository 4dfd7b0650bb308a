"""The self-managed scheduler configuration, given to the real kube-scheduler with the flags of
kubeadm's static pod: it starts with vcuda's extender and kubeadm's kubeconfig, where a file
holding only the `extenders` entry leaves the scheduler without an API server."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import ROOT
from tests.upstream import upstream

REPO = ROOT.parent
CONFIG = ROOT / "placement" / "self-managed" / "kube-scheduler-config.yaml"
KUBEADM_KUBECONFIG = "/etc/kubernetes/scheduler.conf"


def _kube_scheduler() -> Path:
    """kube-scheduler as scripts/build-upstream built it (the real cluster's tests build it)."""
    built = upstream("kube-scheduler")
    if built is None:
        pytest.skip("kube-scheduler is not built here: run scripts/build-upstream")
    return built


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(config: dict[str, object], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """kube-scheduler with kubeadm's flags plus --config, its kubeconfig at a test path (an API
    server that is not there: the configuration is written before any call), asked to write
    the configuration it runs with and stop."""
    kubeconfig = tmp_path / "scheduler.conf"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config).replace(KUBEADM_KUBECONFIG, str(kubeconfig)))
    kubeadm = [f"--authentication-kubeconfig={kubeconfig}",
               f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
               f"--kubeconfig={kubeconfig}", "--leader-elect=true",
               # Not kubeadm's: a free port, so a cluster running here does not clash.
               f"--secure-port={_free_port()}"]
    return subprocess.run([str(_kube_scheduler()), *kubeadm, f"--config={path}",
                           f"--write-config-to={tmp_path / 'running.yaml'}"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_kubeadms_scheduler_runs_with_the_extender_and_its_own_kubeconfig(tmp_path: Path) -> None:
    shipped = yaml.safe_load(CONFIG.read_text())
    assert shipped["clientConnection"]["kubeconfig"] == KUBEADM_KUBECONFIG
    started = _start(shipped, tmp_path)
    assert started.returncode == 0, started.stderr
    running = yaml.safe_load((tmp_path / "running.yaml").read_text())
    assert running["clientConnection"]["kubeconfig"] == str(tmp_path / "scheduler.conf")
    assert running["leaderElection"]["leaderElect"] is True
    [extender] = running["extenders"]
    assert extender["urlPrefix"] == "http://127.0.0.1:8888" and extender["bindVerb"] == "bind"


def test_a_file_with_only_the_extenders_leaves_kubeadms_scheduler_without_an_api_server(
        tmp_path: Path) -> None:
    """Why the file is whole: with --config, kube-scheduler ignores --kubeconfig."""
    started = _start({k: v for k, v in yaml.safe_load(CONFIG.read_text()).items()
                      if k not in ("clientConnection", "leaderElection")}, tmp_path)
    assert started.returncode != 0
    assert not (tmp_path / "running.yaml").exists()
