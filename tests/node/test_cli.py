"""`vcuda-node` as a command: its help, what it says to bad flags, and `run` as a process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime_hook.node.cli import main
from tests.node.accounts import write_account
from tests.node.workloads_on_host import commit_container, labels, scrape

GIB = 1 << 30


def test_help_names_the_three_commands_and_the_metrics(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for command in ("install", "uninstall", "run"):
        assert f"\n  {command} " in text
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "vcuda_container_core_used_ratio" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["run", "--no-advertise", "--port", "70000"], "'70000' is not a TCP port"),
        (["run", "--no-advertise", "--interval", "0.1"], "'0.1' is not a number of seconds"),
        (["run", "--no-advertise", "--interval", "nan"], "'nan' is not a number of seconds"),
        (["run", "--no-advertise", "--interval", "inf"], "'inf' is not a number of seconds"),
        (["run", "--no-advertise", "--memory-scaling", "nan"], "'nan' is not a number in (0"),
        (["install", "--memory-scaling", "inf"], "'inf' is not a number in (0, 100]"),
        (["run", "--no-advertise", "--memory-scaling", "-1"], "'-1' is not a number in (0, 100]"),
        (["run", "--no-advertise", "--cores-scaling", "11"], "'11' is not a number in [1, 10]"),
        (["install", "--max-sharers", "x"], "'x' is not a whole number in 0..1000 (0: no cap)"),
        (["run", "--no-advertise", "--vcuda-run-dir", "tmp"], "'tmp' is not an absolute path"),
        (["run", "--no-advertise", "--host-root", "host"], "'host' is not an absolute path"),
        (["run", "--node-name", "n1", "--domain", "Docker_Com"],
         "--domain: domains: 'Docker_Com' is not a DNS name like 'docker.com'"),
        (["uninstall", "--prefix", "opt"], "'opt' is not an absolute path"),
        (["run", "--dra", "--no-advertise"], "--dra needs Kubernetes; leave out --no-advertise"),
        (["run", "--dra", "--placement", "--node-name", "n1"],
         "--dra and --placement are two ways to place pods on GPUs; a node takes one"),
        (["run", "--dra", "--node-name", "n1", "--library", "/opt/vcuda/libvcuda-2.so"],
         "--library /opt/vcuda/libvcuda-2.so: the file must be named libvcuda.so"),
        (["run", "--dra", "--node-name", "n1", "--kubelet-dir", "var/lib/kubelet"],
         "'var/lib/kubelet' is not an absolute path"),
        (["run", "--dra", "--node-name", "n1", "--account-mib", "0"],
         "'0' is not a size in MiB, 1..1024"),
    ],
)
def test_bad_flags_exit_2_with_the_rule(capsys: pytest.CaptureFixture[str], args: list[str],
                                        message: str) -> None:
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 2
    assert message in capsys.readouterr().err


def test_advertising_needs_the_node_name(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(SystemExit) as done:
        main(["run"])
    assert done.value.code == 2
    assert "--node-name (or $NODE_NAME) is needed to advertise; --no-advertise runs without " \
        "Kubernetes" in capsys.readouterr().err


def test_run_without_credentials_fails_with_one_line(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    status = main(["run", "--node-name", "n1", "--kubeconfig", str(tmp_path / "none")])
    assert status == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "vcuda-node run: no Kubernetes credentials:")


def test_run_serves_container_memory_without_a_gpu_driver_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """The real pynvml on a machine without a driver: the agent says so once and still serves."""
    if os.geteuid() != 0:
        pytest.skip("reads /proc/<pid>/ns of another user's process")
    state = tmp_path / "state"
    with subprocess.Popen(["sleep", "600"]) as first:
        account = commit_container(state, "c0ffee", first.pid, 2 * GIB, 25, ("GPU-a",))
        start = int(Path(f"/proc/{first.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        write_account(account, ["GPU-a"], [(first.pid, start, [GIB])])
        agent = subprocess.Popen(
            [sys.executable, "-m", "runtime_hook.node", "run", "--no-advertise", "--port", "0",
             "--address", "127.0.0.1", "--state-dir", str(state), "--node-name", "n1"],
            stderr=subprocess.PIPE, text=True)
        try:
            assert agent.stderr is not None
            events = []
            for line in agent.stderr:
                events.append(json.loads(line))
                if events[-1]["event"] == "serving":
                    break
            series = scrape(events[-1]["port"])
            agent.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            assert agent.wait(timeout=deadline - time.monotonic()) == 0
            events += [json.loads(line) for line in agent.stderr]
        finally:
            agent.kill()
            first.kill()
    worker = labels(namespace="team", pod="train-0", container="worker", node="n1", gpu="",
                    uuid="GPU-a")
    assert series["vcuda_container_memory_used_bytes"] == {worker: GIB}
    assert series["vcuda_container_memory_limit_bytes"] == {worker: 2 * GIB}
    nvml = [e for e in events if e["event"] == "skipped" and e["source"] == "nvml"]
    assert sorted(e["task"] for e in nvml) == ["advertise", "metrics"]  # once in each task
    assert all(e["reason"].startswith("NVML cannot start:") for e in nvml)
    assert events[-1]["event"] == "stopped"
