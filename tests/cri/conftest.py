"""The containerd nodes of the CRI tests: one for each containerd release found (the system's
and those scripts/fetch-containerd unpacked), every pod removed after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cri.node import ContainerdNode, missing, releases
from tests.cri.pods import GPUS

_RELEASES = releases()


@pytest.fixture(scope="session", params=_RELEASES or [None],
                ids=[f"containerd-{r.version}" for r in _RELEASES] or ["no-containerd"])
def containerd_node(request: pytest.FixtureRequest,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerdNode]:
    """containerd on a node that ``vcuda-node install`` set up (see :mod:`tests.cri.node`)."""
    reason = missing() or ("" if request.param else "no containerd here (scripts/setup "
                           "installs 1.6 and unpacks 1.7 and 2.x)")
    if reason:
        pytest.skip(reason)
    node = ContainerdNode(tmp_path_factory.mktemp("cri-node"), request.param)
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


@pytest.fixture
def node(cri_node: ContainerdNode) -> ContainerdNode:
    """The node with the made-up inventory (:data:`tests.cri.pods.GPUS`); every test starts
    with an empty ledger."""
    cri_node.write_inventory(GPUS)
    assert cri_node.ledger() == []
    return cri_node
