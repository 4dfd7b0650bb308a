"""`vcuda-node status`: the install, the GPUs with what is committed and free, the limited
containers with their limits and use, and each problem with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_hook.contract import INVENTORY_NAME, Gpu, write_inventory
from runtime_hook.node.nvml import Nvml
from runtime_hook.node.status import NodeStatus, as_json, as_text, gather
from runtime_hook.node_state import process_start_time
from tests.node.accounts import write_account
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml
from tests.node.workloads_on_host import commit_container
from tests.shim.harness import REPO

GPU0, GPU1 = "GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"


class Node:
    """A node whose root is the host's (its /proc is the test's) and whose vcuda paths are
    under ``top``."""

    def __init__(self, top: Path) -> None:
        self.prefix = str(top / "usr/local/vcuda")
        self.state = str(top / "run/vcuda")
        self.config = str(top / "etc/containerd/config.toml")
        self.spec = str(top / "etc/vcuda/base-runtime-spec.json")

    def gather(self, devices: list[FakeDevice], **nvml: bool) -> NodeStatus:
        return gather("/", self.prefix, self.state, Nvml(FakeNvml(devices, **nvml)))


def _install_record(node: Node, missing: bool = False) -> None:
    """The record an install on containerd leaves, and its files (one gone if ``missing``)."""
    record = {"version": 1, "runtime": "containerd", "runtime_files": [node.spec],
              "edits": [node.config], "files": [f"{node.prefix}/lib/libvcuda.so"],
              "links": [], "trees": [], "dirs": []}
    for path in (node.spec, node.config, f"{node.prefix}/lib/libvcuda.so"):
        if missing and path == node.config:
            continue
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text("x")
    (Path(node.prefix) / "installed.json").write_text(json.dumps(record))


def _limited_container(node: Node) -> None:
    """This test's process as the container team/train-0/worker: 4 GiB and 30% of GPU0, of
    which it holds 1 GiB."""
    account = commit_container(Path(node.state), "c0ffee", os.getpid(), 4 * GIB, 30, (GPU0,))
    start = process_start_time(os.getpid())
    assert start is not None
    write_account(account, [GPU0], [(os.getpid(), start, [GIB])])


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.fixture
def devices() -> list[FakeDevice]:
    return [FakeDevice(GPU0, 16 * GIB, 5 * GIB, 70), FakeDevice(GPU1, 40 * GIB, 1 * GIB, 10)]


def test_status_shows_the_install_each_gpus_commitments_and_each_containers_limits_and_use(
    node: Node, devices: list[FakeDevice]
) -> None:
    _install_record(node)
    _limited_container(node)
    devices[0].busy = {os.getpid(): 20}
    found = as_json(node.gather(devices))
    assert (found["installed"], found["runtime"], found["runtime_config"]) == (
        True, "containerd", sorted([node.config, node.spec]))
    assert found["gpus_from"] == "nvml"
    assert found["gpus"] == [
        {"index": 0, "uuid": GPU0, "memory_total": 16 * GIB, "memory_committed": 4 * GIB,
         "cores_committed": 30, "sharers": ["team/train-0/worker"],
         "memory_free": 12 * GIB, "cores_free": 70},
        {"index": 1, "uuid": GPU1, "memory_total": 40 * GIB, "memory_committed": 0,
         "cores_committed": 0, "sharers": [], "memory_free": 40 * GIB, "cores_free": 100}]
    assert found["containers"] == [
        {"name": "team/train-0/worker", "uuid": GPU0, "memory_limit": 4 * GIB,
         "cores_limit": 30, "memory_used": GIB, "core_used": 0.2, "processes": 1}]
    assert found["problems"] == [] and found["refused_starts"] == 0


def test_the_text_says_the_same_for_a_person(node: Node, devices: list[FakeDevice]) -> None:
    _install_record(node)
    _limited_container(node)
    text = as_text(node.gather(devices))
    assert text.splitlines()[:2] == [
        f"install: containerd under {node.prefix}",
        f"runtime config: {node.config}, {node.spec}"]
    assert (f"  0 {GPU0}  memory 4.00 GiB of 16.00 GiB committed, 12.00 GiB free; cores 30% "
            "committed, 70% free; sharers: team/train-0/worker") in text
    assert f"  team/train-0/worker on {GPU0}: memory 1.00 GiB of 4.00 GiB, cores 0% of 30%, " \
        "processes 1" in text
    assert "problem" not in text


def test_a_file_of_the_install_gone_from_the_node_is_a_problem_with_its_fix(
    node: Node, devices: list[FakeDevice]
) -> None:
    _install_record(node, missing=True)
    [problem] = node.gather(devices).problems
    assert problem.why == f"gone from the node: {node.config}"
    assert problem.fix.startswith("run vcuda-node install again")


def test_without_nvml_the_gpus_come_from_the_inventory_and_the_driver_is_the_fix(
    node: Node
) -> None:
    _install_record(node)
    inventory = Path(node.state) / INVENTORY_NAME
    inventory.parent.mkdir(parents=True)
    write_inventory(str(inventory), [Gpu(GPU0, 0, 16 * GIB)])
    status = node.gather([], driver_loaded=False)
    assert status.gpus_from == "inventory"
    assert [(g.index, g.uuid, g.memory_total, g.memory_free) for g in status.gpus] == [
        (0, GPU0, 16 * GIB, 16 * GIB)]
    [problem] = status.problems
    assert problem.what == "NVML" and "nvidia-smi" in problem.fix


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime_hook.node", "status", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def test_the_command_prints_json_and_exits_2_when_it_finds_problems(tmp_path: Path) -> None:
    result = _cli("--host-root", str(tmp_path), "--json")
    assert result.returncode == 2, result.stderr
    found = json.loads(result.stdout)
    assert found["installed"] is False and found["gpus"] == []
    assert found["problems"][0]["what"] == "install"
    assert found["problems"][0]["fix"].startswith("run vcuda-node install")


def test_help_says_what_status_shows_and_how_to_run_it() -> None:
    result = _cli("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "committed" in text and "--json" in text and "kubectl -n vcuda-system exec" in text


def test_a_relative_host_root_is_refused_in_our_words() -> None:
    result = _cli("--host-root", "host")
    assert result.returncode == 2
    assert "'host' is not an absolute path" in result.stderr
