"""The containerd node of the CRI tests: one for the session, every pod removed after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cri.node import ContainerdNode, missing


@pytest.fixture(scope="session")
def containerd_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerdNode]:
    """containerd on a node that ``vcuda-node install`` set up (see :mod:`tests.cri.node`)."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    node = ContainerdNode(tmp_path_factory.mktemp("cri-node"))
    try:
        node.start()
        yield node
    finally:
        node.close()


@pytest.fixture
def cri_node(containerd_node: ContainerdNode) -> Iterator[ContainerdNode]:
    """The session's node, running and with no pod left when the test ends."""
    containerd_node.ensure_containerd()
    yield containerd_node
    for pod in containerd_node.cri.pods():
        containerd_node.cri.remove_pod(pod)
