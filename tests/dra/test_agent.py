"""``vcuda-node run --dra``: the command line, and the agent as kubelet and the API see it."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from runtime_hook.contract import Sharing
from runtime_hook.node.agent import Settings, run
from runtime_hook.node.cli import main
from runtime_hook.node.dra.driver import DraSettings
from runtime_hook.node.nvml import Nvml
from tests.dra.conftest import GPU0, GPU1, LIBRARY, NODE
from tests.dra.fake_dra_api import FakeDraApi, slice_path
from tests.dra.kubelet import FakeKubelet
from tests.node.fake_nodes_api import NODE_AGENT
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml


def test_run_help_explains_the_dra_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for flag in ("--dra", "--kubelet-dir", "--cdi-dir", "--library", "--gpu-cdi-kind"):
        assert flag in out
    assert "docs/DRA.md" in out


def test_the_agent_publishes_its_slice_tells_the_node_serves_kubelet_and_leaves_no_socket(
        dra_api: FakeDraApi) -> None:
    assert dra_api.subject == NODE_AGENT
    if os.geteuid() != 0:
        pytest.skip("needs root (the state directory is root's)")
    base = Path(tempfile.mkdtemp(prefix="vcuda-agent-"))
    (base / "kubeconfig").write_text(dra_api.kubeconfig())
    dra = DraSettings(kubelet_dir=str(base / "kubelet"), cdi_dir=str(base / "cdi"),
                      library=LIBRARY, gpu_cdi_kind="nvidia.com/gpu", account_mib=1)
    settings = Settings(host_root="/", state_dir=str(base / "state"), node=NODE, domains=(),
                        sharing=Sharing(), address="127.0.0.1", port=0, interval=1.0,
                        run_dirs=[], advertise=True, kubeconfig=str(base / "kubeconfig"), dra=dra)
    nvml = Nvml(FakeNvml([FakeDevice(GPU0, 16 * GIB), FakeDevice(GPU1, 40 * GIB)]))
    stop = threading.Event()
    agent = threading.Thread(target=run, args=(settings, logging.getLogger("vcuda-node"), stop,
                                               nvml))
    agent.start()
    kubelet = FakeKubelet("/", str(base / "kubelet"))
    try:
        info = kubelet.register(timeout=30)
        assert info.endpoint == f"{base}/kubelet/plugins/vcuda.io/dra.sock"
        deadline = time.monotonic() + 30
        while dra_api.get(slice_path(f"{NODE}-vcuda.io")) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        published = dra_api.get(slice_path(f"{NODE}-vcuda.io"))
        assert published is not None
        assert len(published["spec"]["devices"]) == 2
        # --dra offers the GPUs as a slice, not as the node's extended resources: the node
        # is read (it owns the slice), never written.
        assert {(r.method, r.path) for r in dra_api.requests
                if r.path.startswith("/api/v1/nodes")} == {("GET", f"/api/v1/nodes/{NODE}")}
        # ... and told, as on the other paths, with an Event on the Node
        while not dra_api.events() and time.monotonic() < deadline:
            time.sleep(0.05)
        [told] = dra_api.events()
        assert (told["type"], told["reason"], told["regarding"]["name"],
                told["reportingController"]) == (
            "Normal", "GPUInventoryChanged", NODE, "vcuda.io/node-agent")
    finally:
        kubelet.close()
        stop.set()
        agent.join(timeout=30)
    try:
        assert not agent.is_alive()
        assert os.listdir(kubelet.registry) == []  # kubelet sees the plugin go
    finally:
        shutil.rmtree(base)
