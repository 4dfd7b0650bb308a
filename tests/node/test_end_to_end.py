"""The node end to end: the hook as `vcuda-node install` put it, a container started by runc,
real shim processes in it on the fake driver, and the agent's inventory and metrics.

Only NVML is a test double (the pynvml one); the hook, runc, the container's
pid namespace, its account tmpfs, libvcuda.so and the account it keeps are
the real ones. The shim's processes join the container's pid namespace as
``kubectl exec`` would, with this machine's files (the probe and the fake
driver are not in the busybox image).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_hook.contract import Limits, Sharing, render_limits
from runtime_hook.node.agent import Advertiser, Settings
from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import Nvml
from runtime_hook.node.observe import Observer
from tests.hook.bundles import limits_annotation
from tests.hook.conftest import BuildBundle
from tests.node.fake_pynvml import FakeDevice, FakeNvml
from tests.node.nodes import Node
from tests.node.workloads_on_host import Endpoint, labels
from tests.shim.harness import CONTEXT, GIB, LIBRARY, MIB, REPO, Background, FakeGpu, fake_uuid

PREFIX = "/usr/local/vcuda"
NODE = "gpu-node-1"
POD = {"io.kubernetes.cri.sandbox-namespace": "team", "io.kubernetes.cri.sandbox-name": "train-0"}


class Agent(Endpoint):
    """The agent's two tasks over one state dir, with the NVML double."""

    def __init__(self, state: Path, lib: FakeNvml) -> None:
        log = logging.getLogger("vcuda-node")
        self.lib = lib
        nvml = Nvml(lib)
        settings = Settings(host_root="/", state_dir=str(state), node=NODE, domains=(),
                            sharing=Sharing(), address="127.0.0.1", port=0, interval=1.0,
                            run_dirs=[], advertise=False, kubeconfig=None, placement=False)
        self.advertiser = Advertiser(nvml, settings, None, log)
        super().__init__(Observer(nvml, Problems(log, "metrics"), "/", str(state)), NODE)


@pytest.fixture
def installed(node: Node, gpu: FakeGpu) -> Node:
    """A node where `vcuda-node install` put the real libvcuda.so and the hook."""
    result = node.run("install", "--library", str(LIBRARY), "--no-restart-runtime")
    assert result.returncode == 0, result.stderr
    return node


def _hooks(node: Node, state: Path) -> dict:
    """The installed base spec's hooks, with the node's paths moved under its root."""
    spec = json.loads(node.path("/etc/vcuda/base-runtime-spec.json").read_text())
    moved = {"/run/vcuda": str(state)}
    for entries in spec["hooks"].values():
        for hook in entries:
            hook["args"] = [moved.get(a) or (str(node.path(a)) if a.startswith(PREFIX) else a)
                            for a in hook["args"]]
    return spec["hooks"]


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    running = Agent(state, FakeNvml([FakeDevice(fake_uuid(0), 8 * GIB, 0, 30)]))
    yield running
    running.stop()


def _exec_in(pid: int, gpu: FakeGpu, limits: Path, *words: str) -> Background:
    """Start the probe in the pid namespace of container process ``pid``, stopped at its wait."""
    mount_proc = 'mount -t proc proc /proc && exec "$@"'
    process = subprocess.Popen(
        ["nsenter", "--target", str(pid), "--pid", "--", "unshare", "--mount", "--propagation",
         "private", "sh", "-c", mount_proc, "sh", *gpu.command(*words)],
        env=gpu.environment(VCUDA_LIMITS_FILE=str(limits)),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    background = Background(process)
    background.lines = background.read_to_wait()
    return background


# With 1 GiB of its 2 virtual, the GiB allocated after the context finds no room on the device.
@pytest.mark.parametrize("virtual", [0, GIB])
def test_a_container_started_with_the_installed_hook_shows_its_shims_memory_and_use(
    installed: Node, agent: Agent, gpu: FakeGpu, bundle: BuildBundle, runc, tmp_path: Path,
    virtual: int,
) -> None:
    state = Path(agent.advertiser.inventory).parent
    agent.advertiser.once()  # the inventory the hook checks memory against
    path = bundle(["sleep", "600"], name="worker", annotations={**POD, **limits_annotation(
        worker=(30, 2 * GIB))}, gpus=(fake_uuid(0),),
        hooks=_hooks(installed, state))
    started = runc.run_detached(path, "e2e-worker", tmp_path / "runc.log")
    assert started.returncode == 0, (tmp_path / "runc.log").read_text()
    pid = json.loads(runc.call("state", "e2e-worker").stdout)["pid"]
    [record] = (state / "containers").iterdir()
    # The shim in the container sees /run/vcuda/account; from the host, that is the record's.
    limits = tmp_path / "limits"
    limits.write_text(render_limits(Limits(memory=2 * GIB, cores=30, devices=(fake_uuid(0),),
                                    account=str(record / "account" / "account"),
                                    virtual_memory=virtual)))
    probe = _exec_in(pid, gpu, limits, "init", "ctx", "0", "alloc", "1G", "wait")
    try:
        assert probe.lines[2][:2] == ["alloc", "CUDA_SUCCESS"], probe.lines
        [host_pid] = [int(p) for p in Path(f"/proc/{probe.process.pid}/task/"
                                           f"{probe.process.pid}/children").read_text().split()]
        agent.lib.devices[0].busy = {host_pid: 40, 2: 90}  # 2: the probe's pid in the container
        series = agent.scrape()
    finally:
        probe.process.kill()
        probe.process.wait()
    worker = labels(namespace="team", pod="train-0", container="worker", node=NODE, gpu="0",
                    uuid=fake_uuid(0))
    assert series["vcuda_container_memory_limit_bytes"] == {worker: 2 * GIB}
    assert series["vcuda_container_memory_used_bytes"] == {worker: CONTEXT + GIB}
    assert series["vcuda_container_memory_in_host_bytes"] == {worker: virtual}
    assert series["vcuda_container_core_limit_ratio"] == {worker: 0.3}
    assert series["vcuda_container_core_used_ratio"] == {worker: 0.4}
    assert series["vcuda_container_processes"] == {worker: 1}

    runc.call("kill", "e2e-worker", "KILL")
    runc.call("delete", "--force", "e2e-worker")
    after = agent.scrape()
    assert after.get("vcuda_container_memory_limit_bytes", {}) == {}
    assert list((state / "containers").iterdir()) == []  # poststop released it


def test_a_vcuda_run_command_is_seen_with_its_real_account(gpu: FakeGpu, tmp_path: Path) -> None:
    """The real vcuda-run: its private directory under $TMPDIR is how the agent finds it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    lib = FakeNvml([FakeDevice(fake_uuid(0), 8 * GIB)])
    endpoint = Endpoint(Observer(Nvml(lib), Problems(logging.getLogger("vcuda-node"), "metrics"),
                                 run_dirs=(str(tmp),)), NODE)
    command = [sys.executable, "-m", "runtime_hook.run", "--memory", "4Gi", "--cores", "30",
               "--library", str(LIBRARY), "--",
               *gpu.command("init", "ctx", "0", "alloc", "512M", "wait")]
    process = subprocess.Popen(command, env=gpu.environment(shim=False, TMPDIR=str(tmp)),
                               cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    run = Background(process)
    try:
        run.lines = run.read_to_wait()
        lib.devices[0].busy = {process.pid: 55}
        series = endpoint.scrape()
    finally:
        process.kill()
        process.wait()
        endpoint.stop()
    command_labels = labels(namespace="", pod="", container=f"vcuda-run-{process.pid}",
                            node=NODE, gpu="0", uuid=fake_uuid(0))
    assert series["vcuda_container_memory_limit_bytes"] == {command_labels: 4 * GIB}
    assert series["vcuda_container_memory_used_bytes"] == {command_labels: CONTEXT + 512 * MIB}
    assert series["vcuda_container_core_limit_ratio"] == {command_labels: 0.3}
    assert series["vcuda_container_core_used_ratio"] == {command_labels: 0.55}
