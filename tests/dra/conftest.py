"""Fixtures of the DRA driver's tests: a node (its root, GPUs, ledger), the API, kubelet."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime_hook import contract, syscalls
from runtime_hook.contract import Gpu, Sharing
from runtime_hook.node.dra.driver import DraSettings, Driver
from runtime_hook.node.dra.kube import DraApi
from runtime_hook.node.logs import Problems, setup
from runtime_hook.node.nvml import Nvml
from tests.deploy.manifests import ROOT, documents
from tests.dra.fake_dra_api import NODE_AGENT, FakeDraApi, slice_path
from tests.dra.kubelet import FakeKubelet
from tests.dra.scheduler import Allocator
from tests.fake_kube_api import rules_from_manifests
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml
from tests.shim.harness import LIBRARY as SHIM

NODE = "gpu-node-1"
GPU0 = "GPU-0b5e1d2a-9c41-4f6e-8d3b-5a6f7e8d9c01"
GPU1 = "GPU-1c6f2e3b-ad52-4071-9e4c-6b7081920d12"
LIBRARY = str(SHIM)  # the node path CDI specs bind; scripts/setup builds it


@dataclass
class DraNode:
    """One GPU node with the driver running: kubelet, the API, the scheduler's view.

    The node's root is this machine's: its directories (kubelet's, the hook's
    state, CDI specs) are under ``base``, a short path, since a unix socket's
    path holds 107 bytes. The CDI specs' host paths are real paths here.
    """

    base: Path
    api: FakeDraApi
    kubelet: FakeKubelet
    driver: Driver
    nvml: Nvml
    allocator: Allocator

    @property
    def state_dir(self) -> Path:
        return self.base / "state"

    @property
    def cdi_dir(self) -> Path:
        return self.base / "cdi"

    def claim(self, name: str, cores: str | None = None, memory: str | None = None,
              namespace: str = "team-a", count: int = 1) -> dict[str, Any]:
        """A claim for one share (both amounts None: a whole GPU), allocated by the
        scheduler's rules and stored in the API; None when nothing fits."""
        requests = {k: v for k, v in (("cores", cores), ("memory", memory)) if v is not None}
        exactly: dict[str, Any] = {"deviceClassName": "gpu.vcuda.io", "count": count}
        if requests:
            exactly["capacity"] = {"requests": requests}
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"namespace": namespace, "name": name, "uid": str(uuid.uuid4())},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
        assert self.allocator.allocate(claim), f"the scheduler found no room for {name}"
        self.api.add_claim(claim)
        return claim

    def restart(self, log: logging.Logger) -> None:
        """Stop the agent's driver and start a new one, as a restarted pod would."""
        self.driver.stop()
        self.kubelet.close()
        self.driver = _driver(self.base, self.api, log)
        self.driver.start()


def _driver(base: Path, api: FakeDraApi, log: logging.Logger) -> Driver:
    kubeconfig = base / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig())
    settings = DraSettings(kubelet_dir=str(base / "kubelet"), cdi_dir=str(base / "cdi"),
                           library=LIBRARY, gpu_cdi_kind="nvidia.com/gpu", account_mib=1)
    return Driver(settings, NODE, "/", str(base / "state"), Sharing(), DraApi(str(kubeconfig)), log)


def unmount_below(root: Path) -> None:
    with open("/proc/self/mountinfo") as src:
        points = [line.split()[4] for line in src]
    for point in sorted((p for p in points if p.startswith(f"{root}/")), reverse=True):
        syscalls.umount2(point, syscalls.MNT_DETACH)


@pytest.fixture
def log() -> logging.Logger:
    return setup("debug")


@pytest.fixture
def dra_api(tmp_path: Path) -> Iterator[FakeDraApi]:
    api = FakeDraApi(node_name=NODE)
    api.rules = rules_from_manifests(
        [*documents(ROOT / "base" / "node-rbac.yaml"), *documents(ROOT / "dra" / "rbac.yaml")],
        NODE_AGENT)
    api.add_node(NODE)
    api.start(tmp_path)
    yield api
    api.stop()


@pytest.fixture
def dra_node(tmp_path: Path, dra_api: FakeDraApi, log: logging.Logger) -> Iterator[DraNode]:
    """A node with two GPUs (16 and 40 GiB), its slice published and the plugin registered."""
    if os.geteuid() != 0:
        pytest.skip("preparing a claim mounts its account tmpfs: needs root")
    base = Path(tempfile.mkdtemp(prefix="vcuda-dra-"))
    state = base / "state"
    state.mkdir(mode=0o755)
    inventory = str(state / contract.INVENTORY_NAME)
    contract.write_inventory(inventory, [Gpu(GPU0, 0, 16 * GIB), Gpu(GPU1, 1, 40 * GIB)])
    nvml = Nvml(FakeNvml([FakeDevice(GPU0, 16 * GIB), FakeDevice(GPU1, 40 * GIB)]))
    driver = _driver(base, dra_api, log)
    problems = Problems(log, "advertise")
    driver.publish(nvml, contract.read_inventory(inventory).values(), problems)
    published = dra_api.get(slice_path(f"{NODE}-vcuda.io"))
    assert published is not None, problems.counts
    node = DraNode(base, dra_api, FakeKubelet("/", str(base / "kubelet")), driver, nvml,
                   Allocator([published]))
    driver.start()
    node.kubelet.register()
    try:
        yield node
    finally:
        node.driver.stop()
        node.kubelet.close()
        nvml.close()
        unmount_below(base)
        shutil.rmtree(base)
