"""README "Uninstall" run as written on the real cluster, then "Install" again on the same
node: the node's files back as they were before the first install, the Node object without
vcuda's resources and annotations, a pod of another workload running throughout, and the second
install ready. The test leaves vcuda installed, as the tests after it expect; a failure takes
the cluster down, so that the next test that needs it starts a new one."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cluster.conftest import Clusters
from tests.cluster.kube import Cluster
from tests.cluster.uninstall import NODE, assert_given_back, installed_files, uninstall
from tests.cluster.vcuda import BEFORE_INSTALL, node_snapshot, wait_ready
from tests.cri.images import BUSYBOX_IMAGE


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
        log = uninstall(vcuda, tmp_path, lambda: vcuda.ok("delete", "-k", str(install),
                                                          timeout=600))
        assert '"uninstalled"' in log, log
        assert_given_back(vcuda, before)
        assert _container(vcuda) == running  # the same container, never restarted

        vcuda.ok("apply", "-k", str(install))
        vcuda.ok("label", "node", NODE, "vcuda.io/enabled=true")
        wait_ready(vcuda.kubectl, "device-plugin", NODE)
        # the same install again
        assert installed_files(node_snapshot(state / "node")) == installed_files(installed)
        vcuda.ok("wait", f"node/{NODE}", "--timeout=60s",
                 "--for=jsonpath={.status.allocatable.docker\\.com/vcuda-core}=200")
        assert _container(vcuda) == running
    except BaseException:
        clusters.down()
        raise
    vcuda.ok("delete", "pod", "other-workload", "--wait=true")
