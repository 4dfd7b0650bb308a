"""Fixtures of the node agent's tests: fake nodes, a stand-in library; the hook's, the shim's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.hook.conftest import bundle, runc, spec  # noqa: F401 - containers started by runc
from tests.node.nodes import Node, make_node
from tests.shim.conftest import gpu, shim_build, two_gpus  # noqa: F401 - a real shim's accounts


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
