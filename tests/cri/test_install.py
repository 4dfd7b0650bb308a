"""`vcuda-node install` as the CRI tests' node has it: containerd reads the handler it wrote."""

from __future__ import annotations

import json

import tomllib

from tests.cri.node import ContainerdNode, containerd_config


def test_containerd_runs_the_installed_handler_with_the_nodes_own_cri_settings(
    cri_node: ContainerdNode,
) -> None:
    dumped = cri_node.in_node("containerd", "--config", "/etc/containerd/config.toml",
                              "config", "dump")
    assert dumped.returncode == 0, dumped.stderr
    cri = tomllib.loads(dumped.stdout)["plugins"]["io.containerd.grpc.v1.cri"]
    own = tomllib.loads(containerd_config(cri_node.work))["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == own["sandbox_image"]
    assert cri["cni"]["conf_dir"] == own["cni"]["conf_dir"]
    vcuda = cri["containerd"]["runtimes"]["vcuda"]
    assert vcuda["pod_annotations"] == ["vcuda.io/*"]
    assert vcuda["base_runtime_spec"] == "/etc/vcuda/base-runtime-spec.json"
    assert vcuda["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cri["containerd"]["default_runtime_name"] in cri["containerd"]["runtimes"]


def test_a_second_install_on_the_node_changes_nothing(cri_node: ContainerdNode) -> None:
    result = cri_node.install()
    assert result.returncode == 0, result.stderr
    [done] = [e for e in map(json.loads, result.stderr.splitlines()) if e["event"] == "installed"]
    assert done["changed"] == []
