"""The metrics endpoint, scraped over HTTP and read with prometheus_client's parser.

Containers are real processes in pid namespaces of their own with ledger
records as the hook writes them; their accounts follow the shim's layout;
NVML is the pynvml double.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_hook.contract import VERSION
from runtime_hook.node.logs import Problems, setup
from runtime_hook.node.nvml import Nvml
from runtime_hook.node.observe import Observer
from runtime_hook.node_state import StateDir, process_start_time
from tests.node.accounts import SIZE, write_account
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml
from tests.node.workloads_on_host import (
    Endpoint,
    PidNamespace,
    commit_container,
    labels,
    start_pid_namespace,
    start_vcuda_run,
)
from tests.shim.harness import REPO

MIB = 1 << 20
GPU0, GPU1 = "GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"
NODE = "gpu-node-1"


class Agent(Endpoint):
    """The metrics served over a state dir and a vcuda-run dir."""

    def __init__(self, tmp_path: Path, lib: FakeNvml) -> None:
        self.state = tmp_path / "state"
        self.run_dir = tmp_path / "tmp"
        self.run_dir.mkdir()
        self.lib = lib
        self.problems = Problems(logging.getLogger("vcuda-node"), "metrics")
        super().__init__(Observer(Nvml(lib), self.problems, "/", str(self.state),
                                  (str(self.run_dir),)), NODE)


@pytest.fixture
def devices() -> list[FakeDevice]:
    return [FakeDevice(GPU0, 16 * GIB, 5 * GIB, 70), FakeDevice(GPU1, 40 * GIB, 1 * GIB, 10)]


@pytest.fixture
def agent(tmp_path: Path, devices: list[FakeDevice],
          capsys: pytest.CaptureFixture[str]) -> Iterator[Agent]:
    if os.geteuid() != 0:
        pytest.skip("pid namespaces need root")
    setup("debug")  # after capsys: the log lines are the test's to read
    running = Agent(tmp_path, FakeNvml(devices))
    yield running
    running.stop()


@pytest.fixture
def container() -> Iterator[PidNamespace]:
    namespace = start_pid_namespace(children=2)
    yield namespace
    namespace.stop()


def _worker(container: str = "worker") -> frozenset:
    """The labels of a container of pod team/train-0 on GPU0."""
    return labels(namespace="team", pod="train-0", container=container, node=NODE, gpu="0",
                  uuid=GPU0)


def _gpu(index: int, uuid: str) -> frozenset:
    return labels(node=NODE, gpu=str(index), uuid=uuid)


def _limited_container(agent: Agent, container: PidNamespace, cid: str = "c0ffee") -> Path:
    """The worker: 4 GiB and 30% of GPU0; its two children hold 1 GiB and 512 MiB."""
    account = commit_container(agent.state, cid, container.init, 4 * GIB, 30, (GPU0,))
    write_account(account, [GPU0], [
        (container.ns_pids[1], container.start_time(1), [GIB]),
        (container.ns_pids[2], container.start_time(2), [512 * MIB]),
        (4000, 12345, [2 * GIB]),  # a process that died without freeing its slot
        (container.ns_pids[1] + 50, container.start_time(1), [GIB]),  # no such process
    ])
    return account


def test_a_scrape_shows_each_containers_limits_and_use_on_each_gpu(
    agent: Agent, devices: list[FakeDevice], container: PidNamespace
) -> None:
    _limited_container(agent, container)
    child_1, child_2 = container.host_pids[1:]
    # NVML numbers processes as the host does; the account as the container does. A host
    # process whose pid equals a container pid must not count.
    devices[0].busy = {child_1: 20, child_2: 15, container.ns_pids[1]: 90, 1: 50}

    series = agent.scrape()

    worker = _worker()
    assert series["vcuda_container_memory_limit_bytes"] == {worker: 4 * GIB}
    assert series["vcuda_container_memory_used_bytes"] == {worker: GIB + 512 * MIB}
    assert series["vcuda_container_core_limit_ratio"] == {worker: 0.3}
    assert series["vcuda_container_core_used_ratio"] == {worker: pytest.approx(0.35)}
    assert series["vcuda_container_processes"] == {worker: 2}
    assert series["vcuda_gpu_memory_total_bytes"] == {_gpu(0, GPU0): 16 * GIB,
                                                      _gpu(1, GPU1): 40 * GIB}
    assert series["vcuda_gpu_memory_used_bytes"] == {_gpu(0, GPU0): 5 * GIB,
                                                     _gpu(1, GPU1): GIB}
    assert series["vcuda_gpu_core_used_ratio"] == {_gpu(0, GPU0): 0.7, _gpu(1, GPU1): 0.1}
    assert series["vcuda_gpu_memory_limit_bytes"] == {_gpu(0, GPU0): 4 * GIB, _gpu(1, GPU1): 0}
    assert series["vcuda_gpu_core_limit_ratio"] == {_gpu(0, GPU0): 0.3, _gpu(1, GPU1): 0}
    assert series["vcuda_gpu_containers"] == {_gpu(0, GPU0): 1, _gpu(1, GPU1): 0}


def test_a_vcuda_run_command_is_observed_from_its_private_directory(
    agent: Agent, devices: list[FakeDevice], tmp_path: Path
) -> None:
    account = tmp_path / "private" / "account"
    run = start_vcuda_run(agent.run_dir, "--memory", "2Gi", "--cores", "50", "--devices", GPU1,
                          "--account", str(account))
    pid = run.process.pid
    try:
        write_account(account, [GPU1], [(pid, process_start_time(pid), [256 * MIB])])
        devices[1].busy = {pid: 45}
        series = agent.scrape()
    finally:
        run.stop()
    command = labels(namespace="", pod="", container=f"vcuda-run-{pid}", node=NODE,
                     gpu="1", uuid=GPU1)
    assert series["vcuda_container_memory_limit_bytes"] == {command: 2 * GIB}
    assert series["vcuda_container_memory_used_bytes"] == {command: 256 * MIB}
    assert series["vcuda_container_core_limit_ratio"] == {command: 0.5}
    assert series["vcuda_container_core_used_ratio"] == {command: 0.45}
    # A command's limits are its user's word: the GPU's sums are the ledger's alone.
    assert series["vcuda_gpu_memory_limit_bytes"][_gpu(1, GPU1)] == 0
    assert agent.scrape().get("vcuda_container_memory_limit_bytes", {}) == {}  # it ended


def test_a_container_that_ended_disappears_from_the_next_scrape(
    agent: Agent, container: PidNamespace
) -> None:
    _limited_container(agent, container)
    assert _worker() in agent.scrape()["vcuda_container_memory_used_bytes"]
    container.stop()  # its record stays until a poststop; the agent must not wait for it
    series = agent.scrape()
    assert not any(name.startswith("vcuda_container_") and values
                   for name, values in series.items())
    assert series["vcuda_gpu_containers"] == {_gpu(0, GPU0): 0, _gpu(1, GPU1): 0}


def test_a_container_whose_processes_never_used_cuda_shows_its_limits_and_no_use(
    agent: Agent, container: PidNamespace
) -> None:
    commit_container(agent.state, "idle", container.init, GIB, 10, (GPU0,))
    series = agent.scrape()
    assert series["vcuda_container_memory_limit_bytes"] == {_worker(): GIB}
    assert series["vcuda_container_memory_used_bytes"] == {_worker(): 0}
    assert series["vcuda_container_core_used_ratio"] == {_worker(): 0}


def _events(capsys: pytest.CaptureFixture[str]) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]


def test_bad_data_is_logged_once_and_skipped_while_the_rest_is_served(
    agent: Agent, devices: list[FakeDevice], container: PidNamespace, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _limited_container(agent, container)
    # A damaged ledger record of a live process, containers whose account is garbage or a
    # link planted by the container, a vcuda-run directory with a broken limits file, a GPU
    # that fell off the bus.
    damaged = agent.state / "containers" / "damaged"
    damaged.mkdir()
    (damaged / "owner").write_text(f"{container.init} {container.start_time(0)}\n")
    (damaged / "entry").write_text("not=a complete entry\n")
    garbage = commit_container(agent.state, "garbage", container.init, GIB, 10, (GPU0,),
                               container="garbage")
    garbage.write_bytes(b"\xff" * SIZE)
    planted = commit_container(agent.state, "planted", container.init, GIB, 10, (GPU0,),
                               container="planted")
    planted.symlink_to("/etc/shadow")
    run = start_vcuda_run(agent.run_dir, "--memory", "1Gi")
    broken = run.directory
    (broken / "limits").write_text("version=1\nmemory=lots\n")  # in place: the same file
    devices[1].lost = True

    try:
        first, second = agent.scrape(), agent.scrape()
    finally:
        run.stop()

    for series in (first, second):
        assert series["vcuda_container_memory_used_bytes"] == {_worker(): GIB + 512 * MIB}
        limits = series["vcuda_container_memory_limit_bytes"]
        assert limits[_worker("garbage")] == limits[_worker("planted")] == GIB  # limits stay
        assert series["vcuda_gpu_memory_total_bytes"] == {_gpu(0, GPU0): 16 * GIB}
    assert {dict(key)["source"] for key in second["vcuda_node_collect_errors_total"]} == {
        "ledger", "account", "vcuda-run", "nvml"}
    skipped = [e for e in _events(capsys) if e["event"] == "skipped"]
    assert sorted(e["source"] for e in skipped) == ["account", "account", "ledger", "nvml",
                                                    "vcuda-run"]  # once each, not per scrape
    reasons = {e["what"]: e["reason"] for e in skipped}
    assert reasons[str(garbage)].startswith(f"{garbage} is not a vcuda account")
    assert reasons[str(planted)] == f"account {planted} cannot be opened: Too many levels of " \
        "symbolic links"
    assert reasons[str(broken)] == "limits file: memory and cores must be whole numbers"
    assert reasons["GPU 1"] == "NVML: the GPU has fallen off the bus (NVML error 15)"
    assert reasons["ledger record damaged"] == "unreadable: damaged, or being removed"

    devices[1].lost = False
    agent.scrape()
    recovered = {e["what"] for e in _events(capsys) if e["event"] == "recovered"}
    assert recovered == {"GPU 1", str(broken)}


def test_without_nvml_the_memory_figures_still_come_from_the_accounts(
    agent: Agent, container: PidNamespace
) -> None:
    _limited_container(agent, container)
    agent.scrape()  # NVML up: the agent learns each UUID's index
    agent.lib.driver_loaded = False
    series = agent.scrape()
    assert series["vcuda_container_memory_used_bytes"] == {_worker(): GIB + 512 * MIB}
    assert "vcuda_container_core_used_ratio" not in series or \
        series["vcuda_container_core_used_ratio"] == {}
    assert series["vcuda_node_collect_errors_total"][labels(source="nvml")] >= 1


def test_a_failing_snapshot_still_gets_an_answer(agent: Agent,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    agent.state.mkdir()
    (agent.state / "containers").write_text("not a directory\n")
    series = agent.scrape()
    assert series["vcuda_node_collect_errors_total"] == {labels(source="agent"): 1}
    [failure] = [e for e in _events(capsys) if e["event"] == "snapshot_failed"]
    assert "NotADirectoryError" in failure["error"]


def test_a_rewritten_account_does_not_hide_memory_from_the_driver_figures(
    agent: Agent, devices: list[FakeDevice], container: PidNamespace
) -> None:
    account = _limited_container(agent, container)
    child_1, child_2 = container.host_pids[1:]
    # What the driver sees: both children hold memory (contexts included), and a host
    # process with a container pid's number must not count.
    devices[0].held = {child_1: GIB + 300 * MIB, child_2: 812 * MIB, container.ns_pids[1]: GIB}
    honest = agent.scrape()
    worker = _worker()
    assert honest["vcuda_container_memory_driver_bytes"] == {worker: 2 * GIB + 88 * MIB}
    assert honest["vcuda_container_unaccounted_processes"] == {worker: 0}
    # Root in the container empties its account: its own report drops, the driver's does not.
    write_account(account, [GPU0], [])
    forged = agent.scrape()
    assert forged["vcuda_container_memory_used_bytes"] == {worker: 0}
    assert forged["vcuda_container_memory_driver_bytes"] == {worker: 2 * GIB + 88 * MIB}
    assert forged["vcuda_container_unaccounted_processes"] == {worker: 2}


_OBSERVE = """
import json, logging, sys
from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import Nvml
from runtime_hook.node.observe import Observer
from tests.node.fake_pynvml import FakeDevice, FakeNvml
host_root, uuid = sys.argv[1:3]
busy, held = json.loads(sys.argv[3]), json.loads(sys.argv[4])
device = FakeDevice(uuid, busy={int(p): b for p, b in busy.items()},
                    held={int(p): b for p, b in held.items()})
observer = Observer(Nvml(FakeNvml([device])), Problems(logging.getLogger("t"), "t"), host_root,
                    "/run/vcuda")
print(json.dumps([[u.workload.container, u.memory_used, u.core_used, u.processes,
                   u.memory_driver] for u in observer.snapshot().usages]))
"""


def test_an_agent_in_a_pid_namespace_of_its_own_maps_processes_through_the_hosts_proc(
    container: PidNamespace, tmp_path: Path
) -> None:
    """The DaemonSet runs the agent without hostPID: its own /proc shows none of the node's
    processes, the node's root (--host-root) holds the host's /proc, numbered as NVML does."""
    if os.geteuid() != 0:
        pytest.skip("pid and mount namespaces need root")
    host = tmp_path / "host"
    (host / "proc").mkdir(parents=True)
    state = host / "run" / "vcuda"
    account = commit_container(state, "c0ffee", container.init, 4 * GIB, 30, (GPU0,))
    write_account(account, [GPU0], [(container.ns_pids[1], container.start_time(1), [GIB])])
    child_1, child_2 = container.host_pids[1:]
    busy, held = {child_1: 20, child_2: 15}, {child_1: GIB + 300 * MIB}
    # The host's procfs bound under the host root, then a procfs of the new namespace on /proc.
    enter = 'mount --bind /proc "$0/proc" && mount -t proc proc /proc && exec "$@"'
    observed = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "sh", "-c", enter,
         str(host), sys.executable, "-c", _OBSERVE, str(host), GPU0, json.dumps(busy),
         json.dumps(held)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=60)
    assert observed.returncode == 0, observed.stderr
    [[name, used, core, processes, driver]] = json.loads(observed.stdout)
    assert (name, used, processes, driver) == ("worker", GIB, 1, GIB + 300 * MIB)
    assert core == pytest.approx(0.2)  # the busy processes of the account


def test_an_account_naming_other_gpus_changes_no_gpu_figure_and_adds_no_label(
    agent: Agent, devices: list[FakeDevice], container: PidNamespace,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Root in the container rewrites its account: another container's GPU and 14 invented
    ones next to its own, each with memory held."""
    neighbour = start_pid_namespace(children=1)
    try:
        commit_container(agent.state, "other", neighbour.init, 8 * GIB, 20, (GPU1,),
                         pod="serve-0", container="server")
        account = _limited_container(agent, container)
        invented = [f"GPU-{n:08d}-0000-0000-0000-000000000000" for n in range(14)]
        write_account(account, [GPU0, GPU1, *invented], [
            (container.ns_pids[1], container.start_time(1), [GIB] * 16)])
        series = agent.scrape()
    finally:
        neighbour.stop()

    assert series["vcuda_gpu_memory_limit_bytes"] == {_gpu(0, GPU0): 4 * GIB,
                                                      _gpu(1, GPU1): 8 * GIB}
    assert series["vcuda_gpu_core_limit_ratio"] == {_gpu(0, GPU0): 0.3, _gpu(1, GPU1): 0.2}
    assert series["vcuda_gpu_containers"] == {_gpu(0, GPU0): 1, _gpu(1, GPU1): 1}
    uuids = {dict(key).get("uuid") for values in series.values() for key in values}
    assert uuids == {GPU0, GPU1, None}  # None: series without a uuid label
    assert series["vcuda_container_memory_used_bytes"] == {
        _worker(): GIB,  # its own report, on its own GPU
        labels(namespace="team", pod="serve-0", container="server", node=NODE, gpu="1",
               uuid=GPU1): 0}
    [note] = [e for e in _events(capsys) if e["event"] == "skipped"]
    assert note["what"] == f"{account} devices"
    assert note["reason"].startswith(f"names 15 GPU(s) that are not this workload's or not "
                                     f"this node's ('{GPU1}', '{invented[0]}'")


_TENANT = 1000  # another user of the machine, who may write the shared run dir


def _forge(base: Path, name: str, pid: int, account: Path, uid: int = _TENANT) -> Path:
    """A directory that looks like vcuda-run's, made by user ``uid``: ``pid``'s, 1 TiB."""
    forged = base / name
    forged.mkdir(mode=0o700)
    (forged / "owner").write_text(f"{pid} {process_start_time(pid)}\n")
    (forged / "limits").write_text(f"version=1\nmemory={1 << 40}\ncores=100\ndevices=\n"
                                   f"account={account}\n")
    for path in (forged, forged / "owner", forged / "limits"):
        os.chown(path, uid, uid)
    return forged


def test_a_forged_vcuda_run_directory_cannot_take_over_another_commands_account(
    agent: Agent, capsys: pytest.CaptureFixture[str]
) -> None:
    run = start_vcuda_run(agent.run_dir, "--memory", "2Gi", "--devices", GPU1)
    victim = run.process.pid
    account = write_account(run.directory / "account", [GPU1],
                            [(victim, process_start_time(victim), [256 * MIB])])
    account.chmod(0o644)
    # The tenant's directories sort first. One names the victim's process; one names the
    # tenant's own process, started with its limits file; one links to the victim's.
    claims_victim = _forge(agent.run_dir, "vcuda-run-!a", victim, account)
    own = subprocess.Popen(["sleep", "600"], user=_TENANT, group=_TENANT,
                           env={"VCUDA_LIMITS_FILE": str(agent.run_dir / "vcuda-run-!b/limits")})
    try:
        _forge(agent.run_dir, "vcuda-run-!b", own.pid, account)
        (agent.run_dir / "vcuda-run-!c").symlink_to(run.directory)
        _forge(agent.run_dir, "vcuda-run-!d", own.pid, account)  # not what it was started with
        _forge(agent.run_dir, "vcuda-run-!e", own.pid, account).chmod(0o755)
        series = agent.scrape()
    finally:
        own.kill()
        own.wait()
        run.stop()

    command = labels(namespace="", pod="", container=f"vcuda-run-{victim}", node=NODE, gpu="1",
                     uuid=GPU1)
    assert series["vcuda_container_memory_limit_bytes"] == {command: 2 * GIB}
    assert series["vcuda_container_memory_used_bytes"] == {command: 256 * MIB}
    assert series["vcuda_gpu_memory_limit_bytes"] == {_gpu(0, GPU0): 0, _gpu(1, GPU1): 0}
    reasons = {e["what"]: e["reason"] for e in _events(capsys) if e["event"] == "skipped"}
    assert reasons[str(claims_victim)] == (f"names process {victim}, which runs as uid 0, and "
                                           f"belongs to uid {_TENANT}")
    assert reasons[str(account)] == f"account {account} belongs to uid 0, not to uid {_TENANT}"
    assert reasons[str(agent.run_dir / "vcuda-run-!c")] == (
        "not a directory vcuda-run made (Not a directory)")
    assert reasons[str(agent.run_dir / "vcuda-run-!d")] == (
        f"process {own.pid} was not started with $VCUDA_LIMITS_FILE naming its limits file")
    assert reasons[str(agent.run_dir / "vcuda-run-!e")] == (
        "mode 0755: vcuda-run makes its directories 0700")


def test_the_release_is_a_build_info_gauge_at_one(agent: Agent) -> None:
    assert agent.scrape()["vcuda_build_info"] == {labels(version=VERSION): 1}


def test_the_starts_the_hook_refused_on_the_node_are_counted(agent: Agent) -> None:
    assert agent.scrape()["vcuda_node_refused_starts_total"] == {labels(node=NODE): 0}
    for _ in range(2):
        StateDir(str(agent.state)).count_refusal()  # as the hook does at each refusal
    assert agent.scrape()["vcuda_node_refused_starts_total"] == {labels(node=NODE): 2}


def test_a_container_with_shares_of_two_gpus_has_its_limits_and_use_on_each(
    agent: Agent, container: PidNamespace
) -> None:
    account = commit_container(agent.state, "c0ffee", container.init, 4 * GIB, 30, (GPU0, GPU1))
    write_account(account, [GPU0, GPU1], [
        (container.ns_pids[1], container.start_time(1), [GIB, 0]),
        (container.ns_pids[2], container.start_time(2), [0, 3 * GIB]),
    ])

    series = agent.scrape()

    on_0 = _worker()
    on_1 = labels(namespace="team", pod="train-0", container="worker", node=NODE, gpu="1",
                  uuid=GPU1)
    assert series["vcuda_container_memory_limit_bytes"] == {on_0: 4 * GIB, on_1: 4 * GIB}
    assert series["vcuda_container_memory_used_bytes"] == {on_0: GIB, on_1: 3 * GIB}
    assert series["vcuda_container_core_limit_ratio"] == {on_0: 0.3, on_1: 0.3}
    assert series["vcuda_container_processes"] == {on_0: 1, on_1: 1}
    assert series["vcuda_gpu_memory_limit_bytes"] == {_gpu(0, GPU0): 4 * GIB,
                                                      _gpu(1, GPU1): 4 * GIB}
    assert series["vcuda_gpu_containers"] == {_gpu(0, GPU0): 1, _gpu(1, GPU1): 1}
