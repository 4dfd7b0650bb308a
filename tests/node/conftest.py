"""Fixtures of the node agent's tests: fake nodes, a stand-in library; the hook's, the shim's."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.manifests import ROOT as MANIFESTS
from tests.deploy.manifests import documents
from tests.fake_kube_api import rules_from_manifests
from tests.hook.conftest import bundle, runc, spec  # noqa: F401 - containers started by runc
from tests.node.fake_nodes_api import NODE_AGENT, FakeNodesApi
from tests.node.nodes import Node, make_node
from tests.shim.conftest import gpu, shim_build, two_gpus  # noqa: F401 - a real shim's accounts

NODE = "gpu-node-1"  # the node of the agent's tests against the API
KUBELETS = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu.shared": "8"}


def agent_api(tmp_path: Path) -> FakeNodesApi:
    """A started fake API server that grants the node agent what its manifests grant it."""
    server = FakeNodesApi()
    server.start(tmp_path)
    server.rules = rules_from_manifests(
        documents(MANIFESTS / "base" / "node-rbac.yaml"), NODE_AGENT)
    return server


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeNodesApi]:
    """The agent's API with node NODE, as the kubelet registered it."""
    server = agent_api(tmp_path)
    server.add_node(NODE, KUBELETS)
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(api: FakeNodesApi, tmp_path: Path) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(api.kubeconfig())
    return str(path)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    """A containerd 1.7 node (config version 2, no imports) with Python, sh and systemctl."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("the installer's tests need root and unshare (a private mount namespace)")
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3 to stand for the node's Python")
    fake = make_node(tmp_path / "node")
    fake.write("/etc/containerd/config.toml", 'version = 2\n\n[plugins."io.containerd.cri"]\n')
    return fake


@pytest.fixture
def library(tmp_path: Path) -> Path:
    """A file that stands for libvcuda.so: the installer only copies it."""
    path = tmp_path / "libvcuda.so"
    path.write_bytes(b"\x7fELF stand-in for libvcuda.so\n")
    return path
