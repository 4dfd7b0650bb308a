"""The real one-node cluster of ``scripts/cluster``, with vcuda installed on it in the mode each
test module needs (``--with-vcuda device-plugin``, ``placement``, ``placement/self-managed``,
``dra``)
where podman can build its image. One cluster per machine: the tests are ordered by mode, so
that each mode is brought up once, taken down before the next, and the last is taken down
after the last test here. Skipped only where this machine cannot hold it (not root, no Go to
build Kubernetes)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.kube import Cluster
from tests.podman import require_podman
from tests.upstream import upstream_bin

REPO = Path(__file__).resolve().parents[2]
_SCRIPT = REPO / "scripts" / "cluster"
_HERE = Path(__file__).resolve().parent
# The fixture of each mode, in the order the modes are brought up; other tests take the
# device-plugin path's cluster (or any cluster that is up). Tests that start clusters of
# their own ("own") run first, before the suite's first cluster.
_MODE_FIXTURES = {"no_cluster": "own", "vcuda": "device-plugin", "placement": "placement",
                  "self_managed": "placement/self-managed", "dra": "dra"}
_ORDER = ("own", "device-plugin", "placement", "placement/self-managed", "dra")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the cluster's kubelet, cgroups and bridge need root"
    if upstream_bin() is None and not shutil.which("go"):
        return "Kubernetes is built from its Go modules: install Go (tests/cluster/upstream)"
    return None


def _mode_of(item: pytest.Item) -> str:
    names = getattr(item, "fixturenames", ())
    return next((mode for fixture, mode in _MODE_FIXTURES.items() if fixture in names),
                "device-plugin")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of this folder ordered by the mode of vcuda they need (stable within one),
    in the places they had among the session's tests."""
    places = [i for i, item in enumerate(items) if _HERE in Path(str(item.path)).parents]
    ordered = sorted((items[i] for i in places), key=lambda item: _ORDER.index(_mode_of(item)))
    for place, item in zip(places, ordered):
        items[place] = item


class Clusters:
    """The machine's one cluster, brought up in the mode asked for (the one up taken down
    first); with VCUDA_CLUSTER_KUBECONFIG, the cluster already up of that admin kubeconfig
    (left up), whose mode the tests of another skip."""

    def __init__(self) -> None:
        self.mode: str | None = None
        self.handle: Cluster | None = None
        given = os.environ.get("VCUDA_CLUSTER_KUBECONFIG")
        if given:
            kubeconfig = Path(given)
            self.handle = Cluster(kubeconfig, kubeconfig.parent / "bin" / "kubectl")
            self.mode = _installed_mode(self.handle)
            self.handle = Cluster(kubeconfig, self.handle.kubectl_path, self.mode is not None)
        self.given = bool(given)

    def any(self) -> Cluster:
        """Whichever cluster is up, else the device-plugin path's (a bare one without
        podman)."""
        if self.handle is not None:
            return self.handle
        return self.get("device-plugin" if shutil.which("podman") else None)

    def get(self, mode: str | None) -> Cluster:
        """The cluster with vcuda installed in ``mode`` (None: none)."""
        if self.handle is not None and self.mode == mode:
            return self.handle
        if self.given:
            pytest.skip(f"the cluster of VCUDA_CLUSTER_KUBECONFIG has vcuda in mode "
                        f"{self.mode}, these tests need {mode}")
        reason = _missing()
        if reason:
            pytest.skip(reason)
        if mode is not None and not shutil.which("podman"):
            require_podman("to build the image that vcuda is installed from")
        self.down()
        # VCUDA_KUBERNETES_VERSION (X.Y.Z) runs the suite on a release other than the default.
        version = os.environ.get("VCUDA_KUBERNETES_VERSION")
        started = subprocess.run([str(_SCRIPT), "up", *(["--version", version] if version else []),
                                  *(["--with-vcuda", mode] if mode else [])],
                                 stdout=subprocess.PIPE, text=True, timeout=1800, check=False)
        if started.returncode != 0:
            self.down()
            pytest.fail(f"scripts/cluster up --with-vcuda {mode} failed:\n{started.stdout}")
        kubeconfig = Path(started.stdout.strip().splitlines()[-1])
        self.mode = mode
        self.handle = Cluster(kubeconfig, kubeconfig.parent / "bin" / "kubectl",
                              mode is not None)
        return self.handle

    def down(self) -> None:
        """Take down the cluster these tests started, if any."""
        if self.handle is not None and not self.given:
            subprocess.run([str(_SCRIPT), "down"], timeout=300, check=False)
            self.handle = None


def _installed_mode(cluster: Cluster) -> str | None:
    """The mode vcuda is installed in on ``cluster`` (None: not installed)."""
    def has(*args: str) -> bool:
        return cluster.kubectl("get", *args, "-n", "vcuda-system").returncode == 0

    if not has("namespace", "vcuda-system"):
        return None
    if has("deployment", "vcuda-scheduler"):
        return "placement"
    if has("daemonset", "vcuda-scheduler-extender"):
        return "placement/self-managed"
    if cluster.kubectl("get", "deviceclass", "gpu.vcuda.io").returncode == 0:
        return "dra"
    return "device-plugin"


@pytest.fixture(scope="package")
def clusters() -> Iterator[Clusters]:
    """The cluster of tests/cluster; ``down`` after its last test, whatever happened, so that
    the rest of the suite runs on a machine without it."""
    held = Clusters()
    try:
        yield held
    finally:
        held.down()


@pytest.fixture
def no_cluster(clusters: Clusters) -> None:
    """This machine without the suite's cluster, for a test that starts clusters itself."""
    if clusters.given:
        pytest.skip("VCUDA_CLUSTER_KUBECONFIG names a cluster that is up: one cluster per "
                    "machine")
    reason = _missing()
    if reason:
        pytest.skip(reason)
    clusters.down()


@pytest.fixture(scope="module")
def cluster(clusters: Clusters) -> Cluster:
    """A cluster of the upstream components (vcuda installed on it or not)."""
    return clusters.any()


@pytest.fixture(scope="module")
def vcuda(clusters: Clusters) -> Cluster:
    """The cluster, with vcuda installed on it as README "Install" says (NVIDIA's device
    plugin path)."""
    return clusters.get("device-plugin")


@pytest.fixture(scope="module")
def placement(clusters: Clusters) -> Cluster:
    """The cluster, with vcuda installed on the per-GPU placement path with the second
    scheduler, ``vcuda-scheduler`` (``manifests/placement``)."""
    return clusters.get("placement")


@pytest.fixture(scope="module")
def self_managed(clusters: Clusters) -> Cluster:
    """The cluster, with vcuda's extender in its own kube-scheduler's configuration
    (``manifests/placement/self-managed``)."""
    return clusters.get("placement/self-managed")


@pytest.fixture(scope="module")
def dra(clusters: Clusters) -> Cluster:
    """The cluster, with vcuda installed as a DRA driver (``manifests/dra``): claims placed by
    the cluster's own kube-scheduler, prepared by the node agent as kubelet's plugin."""
    return clusters.get("dra")
