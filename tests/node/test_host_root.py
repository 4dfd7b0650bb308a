"""Node paths under the mounted host root: the node's links are followed inside it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from runtime_hook.node.host_root import host_path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A node's root as Debian has it: ``/var/run`` an absolute link to ``/run``."""
    (tmp_path / "run").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "run").symlink_to("/run")
    return tmp_path


def test_an_absolute_link_of_the_node_leads_to_the_nodes_directory_not_this_machines(
    root: Path,
) -> None:
    assert host_path(str(root), "/var/run/cdi") == f"{root}/run/cdi"
    assert host_path(str(root), "/var/run/cdi/spec.json") == f"{root}/run/cdi/spec.json"


def test_relative_links_dot_dot_and_missing_parts_resolve_as_on_the_node(root: Path) -> None:
    (root / "var" / "lib").mkdir()
    (root / "data").mkdir()
    (root / "var" / "lib" / "kubelet").symlink_to("../../data/kubelet")  # not there yet
    assert host_path(str(root), "/var/lib/kubelet/plugins") == f"{root}/data/kubelet/plugins"
    assert host_path(str(root), "/var/run/../lib/x") == f"{root}/lib/x"  # /run/.. is /
    assert host_path(str(root), "/../../etc") == f"{root}/etc"  # never above the root


def test_a_path_without_links_is_the_plain_join(root: Path) -> None:
    assert host_path(str(root), "/run/vcuda/inventory") == f"{root}/run/vcuda/inventory"
    assert host_path("/", "/run/vcuda") == "/run/vcuda"


def test_a_loop_of_links_is_refused(root: Path) -> None:
    (root / "a").symlink_to("/b")
    (root / "b").symlink_to("a")
    with pytest.raises(OSError) as caught:
        host_path(str(root), "/a/x")
    assert caught.value.errno == errno.ELOOP
    assert os.path.islink(root / "a")
