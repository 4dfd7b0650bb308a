"""README "Uninstall" run as written on the real cluster, then "Install" again on the same
node: the node's files back as they were before the first install, the Node object without
vcuda's resources and annotations, a pod of another workload running throughout, and the second
install ready. The test leaves vcuda installed, as the tests after it expect; a failure takes
the cluster down, so that the next test that needs it starts a new one."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.cluster.conftest import Clusters
from tests.cluster.kube import Cluster
from tests.cluster.vcuda import BEFORE_INSTALL, NAMESPACE, REPO, node_snapshot, wait_ready
from tests.cri.images import BUSYBOX_IMAGE

NODE = "vcuda-test-node"
# What README "Uninstall" says stays on the node: an empty /usr/local/vcuda, and /run/vcuda
# (the agent's GPU inventory and the hook's log, on the tmpfs /run).
PREFIX = "usr/local/vcuda"
STATE_DIR = "run/vcuda"


def _named_by_the_readme(path: str) -> bool:
    return path in (PREFIX, STATE_DIR) or path.startswith(STATE_DIR + "/")


def _installed_files(snapshot: dict[str, str]) -> dict[str, str]:
    """What an install writes of a snapshot: not the agent's state in /run/vcuda, nor the
    bytecode the node's Python leaves beside the hook's modules when it runs them."""
    return {path: kind for path, kind in snapshot.items()
            if not path.startswith("run/") and "/__pycache__" not in path}


def _plain_pod() -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "other-workload", "namespace": "default"},
                       "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                           "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                           "command": ["sleep", "3600"]}]}})


def _container(cluster: Cluster) -> tuple[str, str, int]:
    pod = cluster.get("pod", "other-workload")
    status = pod["status"]["containerStatuses"][0]
    return pod["status"]["phase"], status["containerID"], status["restartCount"]


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


def _uninstall(cluster: Cluster, install: Path, work: Path) -> str:
    """README "Uninstall" steps 1 to 3 (4, the device plugin's, is left: it is optional);
    the uninstall's log."""
    cluster.ok("label", "node", NODE, "vcuda.io/enabled-", "vcuda.io/uninstall=true")
    uninstall = _uninstall_overlay(cluster, work)
    cluster.ok("apply", "-k", str(uninstall))
    cluster.ok("-n", NAMESPACE, "rollout", "status", "daemonset/vcuda-node-uninstall",
               "--timeout=300s", timeout=330)
    log = cluster.ok("-n", NAMESPACE, "logs", "-l", "app.kubernetes.io/name=vcuda-node-uninstall",
                     "-c", "uninstall", "--prefix")
    cluster.ok("delete", "-k", str(uninstall), timeout=300)
    cluster.ok("label", "node", NODE, "vcuda.io/uninstall-")
    cluster.ok("delete", "-k", str(install), timeout=600)
    return log


def test_uninstall_as_the_readme_says_gives_the_node_back_and_a_second_install_works(
        clusters: Clusters, vcuda: Cluster, tmp_path: Path) -> None:
    state = vcuda.kubeconfig.parent
    before = json.loads((state / BEFORE_INSTALL).read_text())
    install = state / "vcuda-overlay"  # README "Install", step 3's overlay, as up applied it
    vcuda.ok("apply", "-f", "-", stdin=_plain_pod())
    try:
        vcuda.ok("wait", "pod/other-workload", "--for=jsonpath={.status.phase}=Running",
                 "--timeout=120s")
        running = _container(vcuda)
        installed = node_snapshot(state / "node")
        assert installed != before  # the install changed the node
        log = _uninstall(vcuda, install, tmp_path)
        assert '"uninstalled"' in log, log
        after = node_snapshot(state / "node")
        assert {k: v for k, v in after.items() if not _named_by_the_readme(k)} == before, {
            path: (before.get(path), after.get(path)) for path in sorted({*before, *after})
            if before.get(path) != after.get(path) and not _named_by_the_readme(path)}
        assert after[PREFIX] == "directory"  # and nothing in it
        assert not [path for path in after if path.startswith(PREFIX + "/")]
        node = vcuda.get("node", NODE)
        for kind in ("capacity", "allocatable"):
            assert not [r for r in node["status"][kind] if "vcuda-" in r], node["status"][kind]
        assert not [a for a in node["metadata"].get("annotations", {})
                    if a.startswith("vcuda.io/")]
        assert vcuda.kubectl("get", "runtimeclass", "vcuda").returncode != 0
        assert vcuda.kubectl("get", "mutatingwebhookconfiguration",
                             "vcuda-webhook").returncode != 0
        assert _container(vcuda) == running  # the same container, never restarted

        vcuda.ok("apply", "-k", str(install))
        vcuda.ok("label", "node", NODE, "vcuda.io/enabled=true")
        wait_ready(vcuda.kubectl, "device-plugin", NODE)
        # the same install again
        assert _installed_files(node_snapshot(state / "node")) == _installed_files(installed)
        vcuda.ok("wait", f"node/{NODE}", "--timeout=60s",
                 "--for=jsonpath={.status.allocatable.docker\\.com/vcuda-core}=200")
        assert _container(vcuda) == running
    except BaseException:
        clusters.down()
        raise
    vcuda.ok("delete", "pod", "other-workload", "--wait=true")
