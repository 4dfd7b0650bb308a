"""`vcuda-node install` as the CRI tests' node has it: containerd reads the handler it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.cri.client import CriError
from tests.cri.node import CDI_DIRS, SANDBOX_IMAGE, ContainerdNode, containerd_config, cri_plugins


def test_containerd_runs_the_installed_handler_with_the_nodes_own_cri_settings(
    cri_node: ContainerdNode,
) -> None:
    release = cri_node.release
    dumped = cri_node.in_node(release.tool("containerd"), "--config",
                              "/etc/containerd/config.toml", "config", "dump")
    assert dumped.returncode == 0, dumped.stderr
    plugins = tomllib.loads(dumped.stdout)["plugins"]
    runtime_section, images_section = cri_plugins(release.config_version)
    cri, images = plugins[runtime_section], plugins[images_section]
    sandbox = (images["pinned_images"]["sandbox"] if release.config_version == 3
               else images["sandbox_image"])
    assert sandbox == SANDBOX_IMAGE
    assert cri["cni"]["conf_dir"] == f"{cri_node.work}/cni"
    if release.has_cdi:
        assert (cri["enable_cdi"], cri["cdi_spec_dirs"]) == (True, list(CDI_DIRS))
    vcuda = cri["containerd"]["runtimes"]["vcuda"]
    assert vcuda["pod_annotations"] == ["vcuda.io/*"]
    assert vcuda["base_runtime_spec"] == "/etc/vcuda/base-runtime-spec.json"
    assert vcuda["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cri["containerd"]["default_runtime_name"] in cri["containerd"]["runtimes"]


def test_the_node_runs_the_containerd_release_it_is_named_after(cri_node: ContainerdNode) -> None:
    answer = cri_node.cri.version()
    assert answer.runtime_name == "containerd"
    assert answer.runtime_version.removeprefix("v").startswith(cri_node.release.version)
    # The shim of a pod is the release's own too (containerd looks for it on PATH).
    pause = cri_node.cri.sandbox_pid(cri_node.cri.run_pod("shim", handler=""))
    shim = Path(f"/proc/{pause}/stat").read_text().rsplit(")", 1)[1].split()[1]
    assert os.readlink(f"/proc/{shim}/exe") == cri_node.release.tool("containerd-shim-runc-v2")


def test_a_second_install_on_the_node_changes_nothing(cri_node: ContainerdNode) -> None:
    result = cri_node.install()
    assert result.returncode == 0, result.stderr
    [done] = [e for e in map(json.loads, result.stderr.splitlines()) if e["event"] == "installed"]
    assert done["changed"] == []


def test_uninstall_leaves_containerd_as_it_was_and_a_new_install_brings_the_handler_back(
    cri_node: ContainerdNode,
) -> None:
    config = cri_node.path("/etc/containerd/config.toml")
    try:
        _uninstall(cri_node)
        assert config.read_text() == containerd_config(cri_node.work, cri_node.release)
        assert not cri_node.path("/etc/containerd/conf.d").exists()
        assert not cri_node.path("/etc/vcuda").exists()
        cri_node.stop_containerd()  # as systemctl restart does
        cri_node.start_containerd()
        with pytest.raises(CriError, match=r"no runtime for \"vcuda\" is configured"):
            cri_node.cri.run_pod("orphan")
        cri_node.cri.run_pod("plain", handler="")  # the node's own runtime is still there
    finally:
        again = cri_node.install()
        cri_node.stop_containerd()
        cri_node.start_containerd()
    assert again.returncode == 0, again.stderr
    cri_node.cri.run_pod("back")


def _uninstall(node: ContainerdNode) -> None:
    done = node.in_node(sys.executable, "-m", "runtime_hook.node", "uninstall",
                        "--no-restart-runtime")
    assert done.returncode == 0, done.stderr


def _dumped_handler(node: ContainerdNode) -> dict:
    """The vcuda runtime as the node's containerd reads its configuration, {} if none."""
    dumped = node.in_node(node.release.tool("containerd"), "--config",
                          "/etc/containerd/config.toml", "config", "dump")
    assert dumped.returncode == 0, dumped.stderr
    cri = tomllib.loads(dumped.stdout)["plugins"][cri_plugins(node.release.config_version)[0]]
    return cri["containerd"]["runtimes"].get("vcuda", {})


def test_install_takes_the_config_containerd_writes_by_default_and_uninstall_restores_it(
    cri_node: ContainerdNode,
) -> None:
    """``containerd config default`` with the systemd cgroup driver, as kubeadm's guide has a
    node make it (2.x writes an empty ``imports`` list there)."""
    written = subprocess.run([cri_node.release.tool("containerd"), "config", "default"],
                             capture_output=True, text=True, check=True, timeout=30).stdout
    default = written.replace("SystemdCgroup = false", "SystemdCgroup = true")
    assert default != written
    config = cri_node.path("/etc/containerd/config.toml")
    own = None
    try:
        _uninstall(cri_node)
        own = config.read_text()
        config.write_text(default)
        result = cri_node.install()
        assert result.returncode == 0, result.stderr
        handler = _dumped_handler(cri_node)
        assert handler["base_runtime_spec"] == "/etc/vcuda/base-runtime-spec.json"
        assert handler["options"]["SystemdCgroup"] is True
        _uninstall(cri_node)
        assert config.read_text() == default
        assert _dumped_handler(cri_node) == {}
    finally:
        if own is not None:
            config.write_text(own)
        assert cri_node.install().returncode == 0
