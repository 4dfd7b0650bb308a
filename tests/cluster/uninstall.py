"""README "Uninstall" on the real cluster, whichever way vcuda was installed (kustomize or
Helm), and what it must leave: the node's files as before the first install, the Node
object without vcuda's resources and annotations, none of vcuda's cluster-wide objects."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.cluster.kube import Cluster
from tests.cluster.vcuda import NAMESPACE, REPO, node_snapshot

NODE = "vcuda-test-node"
# What README "Uninstall" says stays on the node: an empty /usr/local/vcuda, and /run/vcuda
# (the agent's GPU inventory and the hook's log, on the tmpfs /run).
PREFIX = "usr/local/vcuda"
STATE_DIR = "run/vcuda"


def _named_by_the_readme(path: str) -> bool:
    return path in (PREFIX, STATE_DIR) or path.startswith(STATE_DIR + "/")


def installed_files(snapshot: dict[str, str]) -> dict[str, str]:
    """What an install writes of a snapshot: not the agent's state in /run/vcuda, nor the
    bytecode the node's Python leaves beside the hook's modules when it runs them."""
    return {path: kind for path, kind in snapshot.items()
            if not path.startswith("run/") and "/__pycache__" not in path}


def _uninstall_overlay(cluster: Cluster, work: Path) -> Path:
    """README's vcuda-uninstall/kustomization.yaml, naming the installed image."""
    name, tag = cluster.vcuda_image().rsplit(":", 1)
    directory = work / "vcuda-uninstall"
    directory.mkdir(exist_ok=True)
    (directory / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(REPO / 'manifests' / 'uninstall', directory)}]\n"
        "images:\n"
        f"  - {{name: registry.invalid/vcuda/vcuda, newName: {name}, newTag: {tag}}}\n")
    return directory


def uninstall(cluster: Cluster, work: Path, remove_install: Callable[[], object]) -> str:
    """README "Uninstall" steps 1 to 3 (4, the device plugin's, is left: it is optional), step
    3 by ``remove_install`` (``delete -k`` of the overlay, or ``helm uninstall``); the log of
    the node's uninstall."""
    cluster.ok("label", "node", NODE, "vcuda.io/enabled-", "vcuda.io/uninstall=true")
    overlay = _uninstall_overlay(cluster, work)
    cluster.ok("apply", "-k", str(overlay))
    cluster.ok("-n", NAMESPACE, "rollout", "status", "daemonset/vcuda-node-uninstall",
               "--timeout=300s", timeout=330)
    log = cluster.ok("-n", NAMESPACE, "logs", "-l", "app.kubernetes.io/name=vcuda-node-uninstall",
                     "-c", "uninstall", "--prefix")
    cluster.ok("delete", "-k", str(overlay), timeout=300)
    cluster.ok("label", "node", NODE, "vcuda.io/uninstall-")
    remove_install()
    return log


def assert_given_back(cluster: Cluster, before: dict[str, str]) -> None:
    """The node's files are ``before`` (its snapshot before the first install) but for what
    the README says stays; its Node has no vcuda resource or annotation; vcuda's cluster-wide
    objects are gone."""
    after = node_snapshot(cluster.kubeconfig.parent / "node")
    assert {k: v for k, v in after.items() if not _named_by_the_readme(k)} == before, {
        path: (before.get(path), after.get(path)) for path in sorted({*before, *after})
        if before.get(path) != after.get(path) and not _named_by_the_readme(path)}
    assert after[PREFIX] == "directory"  # and nothing in it
    assert not [path for path in after if path.startswith(PREFIX + "/")]
    node = cluster.get("node", NODE)
    for kind in ("capacity", "allocatable"):
        assert not [r for r in node["status"][kind] if "vcuda-" in r], node["status"][kind]
    assert not [a for a in node["metadata"].get("annotations", {}) if a.startswith("vcuda.io/")]
    assert cluster.kubectl("get", "runtimeclass", "vcuda").returncode != 0
    assert cluster.kubectl("get", "mutatingwebhookconfiguration", "vcuda-webhook").returncode != 0
    left = cluster.ok("get", "clusterroles,clusterrolebindings,validatingadmissionpolicies",
                      "-o", "name").split()
    for namespace in ("default", "kube-system"):  # the grants vcuda makes outside its own
        left += cluster.ok("get", "roles,rolebindings", "-n", namespace, "-o", "name").split()
    assert not [name for name in left if "/vcuda-" in name], left
