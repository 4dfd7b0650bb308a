"""Per-GPU placement with the cluster's own kube-scheduler calling vcuda's extender
(``scripts/cluster up --with-vcuda placement/self-managed``: the scheduler started with the
README's ``kube-scheduler-config.yaml``, the extender's DaemonSet on the control-plane node,
on 127.0.0.1:8888); binpack as shipped, then spread as docs/PLACEMENT.md gives it."""

from __future__ import annotations

import json
import re
import urllib.request

from tests.cluster import placement as p
from tests.cluster.kube import Cluster
from tests.cluster.vcuda import NAMESPACE

BIG = p.share(20, 10)  # only the 16 GiB GPU holds it
SMALL = p.share(10, 2)  # either GPU holds it
_EXTENDER = "http://127.0.0.1:8888"  # the DaemonSet's, on the node's (this machine's) network


def _binds() -> int:
    """The binds the extender answered ok, from its /metrics."""
    with urllib.request.urlopen(f"{_EXTENDER}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        labels = re.match(r"vcuda_extender_requests_total\{(.*)\} (\S+)$", line)
        if labels and set(labels.group(1).split(",")) == {'verb="bind"', 'outcome="ok"'}:
            return int(float(labels.group(2)))
    raise AssertionError(f"no count of binds in the extender's /metrics:\n{text}")


def _placed(cluster: Cluster, *limits: dict[str, str]) -> list[str]:
    """The shared GPU of each of pods made with ``limits``, created one after the other."""
    image = cluster.vcuda_image()
    names = [f"share-{n}" for n in range(len(limits))]
    try:
        for name, wanted in zip(names, limits):
            p.create(cluster, p.pod(name, image, wanted))
            p.wait_running(cluster, name)
        placed = []
        for name in names:
            shared = p.assignment(cluster, name).shared
            assert shared is not None and p.spec_gpus(cluster, name) == [shared[0]]
            placed.append(shared[0])
        return placed
    finally:
        p.delete(cluster, *names)


def test_the_clusters_own_scheduler_binds_through_the_extender_with_binpack(
        self_managed: Cluster) -> None:
    large, _ = (gpu.uuid for gpu in p.gpus(self_managed))
    binds = _binds()
    assert _placed(self_managed, BIG, SMALL) == [large, large]
    assert _binds() == binds + 2
    pod = p.pod("default-scheduler", self_managed.vcuda_image(), SMALL)
    made = json.loads(self_managed.ok("create", "--dry-run=server", "-o", "json", "-f", "-",
                                      stdin=json.dumps(pod)))
    assert made["spec"]["schedulerName"] == "default-scheduler"  # left as it was


def test_spread_puts_a_share_on_the_emptier_gpu(self_managed: Cluster) -> None:
    large, small = (gpu.uuid for gpu in p.gpus(self_managed))
    daemonset = "daemonset/vcuda-scheduler-extender"
    command = self_managed.get(daemonset, "-n", NAMESPACE)["spec"]["template"]["spec"][
        "containers"][0]["command"]
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/command/-",
              "value": "--strategy=spread"}]
    self_managed.ok("patch", daemonset, "-n", NAMESPACE, "--type=json", "-p", json.dumps(patch))
    try:
        self_managed.ok("rollout", "status", daemonset, "-n", NAMESPACE, "--timeout=180s")
        p.ready(self_managed)
        assert _placed(self_managed, BIG, SMALL) == [large, small]
    finally:
        restore = [{"op": "replace", "path": "/spec/template/spec/containers/0/command",
                    "value": command}]
        self_managed.ok("patch", daemonset, "-n", NAMESPACE, "--type=json", "-p",
                        json.dumps(restore))
        self_managed.ok("rollout", "status", daemonset, "-n", NAMESPACE, "--timeout=180s")
