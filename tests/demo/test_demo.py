"""The demo end to end, as a user runs it: real webhook, real runc, real hook; no GPU needed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from demo.commands import REPO
from runtime_hook.contract import Gpu, write_inventory

GIB = 1 << 30
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runc") or not shutil.which("busybox"),
    reason="the demo needs root, runc and busybox-static (scripts/setup installs them)",
)


def _demo(tmp: Path, *args: str, python: str = sys.executable,
          path: str | None = None) -> subprocess.CompletedProcess[str]:
    """``bash scripts/demo --python PYTHON ARGS`` with its work files under ``tmp/work``."""
    env = {**os.environ, "TMPDIR": str(_work(tmp))}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["/bin/bash", "scripts/demo", "--python", python, *args], cwd=REPO,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300, check=False)


def _work(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    return work


def _step(stdout: str, title: str) -> tuple[str, str]:
    """(status, the step's line and details) of the step whose title starts with ``title``."""
    blocks = re.split(r"\n(?=\S)", stdout)
    for block in blocks:
        found = re.match(r"(ok|FAILED|skipped) +\d+\. (.*)", block)
        if found and found.group(2).startswith(title):
            return found.group(1), block
    raise AssertionError(f"no step {title!r} in:\n{stdout}")


def _statuses(stdout: str) -> list[str]:
    return re.findall(r"^(ok|FAILED|skipped) +\d+\. ", stdout, re.MULTILINE)


def _left_behind(tmp: Path) -> list[Path]:
    return list(_work(tmp).iterdir())


def test_the_demo_shows_the_whole_path_of_each_pod_and_exits_0(tmp_path: Path) -> None:
    done = _demo(tmp_path)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "FAILED" not in out and "Traceback" not in done.stderr

    status, webhook = _step(out, "start the admission webhook")
    assert status == "ok" and "https://127.0.0.1:" in webhook and "verified TLS" in webhook

    status, shared = _step(out, "review pod demo/shared-notebook")
    assert status == "ok" and "admitted" in shared
    assert "add /spec/containers/0/resources/limits/nvidia.com~1gpu.shared \"1\"" in shared
    assert 'vcuda.io/limits: {"notebook":{"cores":30,"memory":10737418240}}' in shared
    assert "runtimeClassName: vcuda" in shared

    status, exclusive = _step(out, "review pod demo/exclusive-training")
    assert status == "ok" and "nvidia.com/gpu: 2" in exclusive
    assert "vcuda.io/limits: (none)" in exclusive

    status, invalid = _step(out, "review pod demo/invalid-request")
    assert status == "ok" and "denied" in invalid
    assert "message:  " in invalid and "150" in invalid

    status, forged = _step(out, "review pod demo/forged-limits")
    assert status == "ok" and "warning:  vcuda.io/limits was replaced" in forged
    assert 'vcuda.io/limits: {"app":{"cores":10,"memory":1073741824}}' in forged

    status, node = _step(out, "prepare the node")
    assert status == "ok"
    assert "no NVIDIA GPU here" in node or "from nvidia-smi" in node

    status, notebook = _step(out, "start container demo/shared-notebook/notebook")
    assert status == "ok"
    assert "/etc/ld.so.preload:   /usr/local/vcuda/lib/libvcuda.so" in notebook
    for line in ("version=1", "memory=10737418240", "cores=30", "account=/run/vcuda/account"):
        assert re.search(rf"^ +(/etc/vcuda/limits: +)?{line}$", notebook, re.MULTILINE), line
    assert "Read-only file system" in notebook

    status, trainer = _step(out, "start container demo/exclusive-training/trainer")
    assert status == "ok"
    assert re.search(r"/etc/ld.so.preload: +\(absent\)", trainer)
    assert re.search(r"/etc/vcuda/limits: +\(absent\)", trainer)

    status, app = _step(out, "start container demo/forged-limits/app")
    assert status == "ok" and "memory=1073741824" in app and "cores=10" in app
    assert "cores=99" not in app

    status, placed = _step(out, "place a shared pod on a node with a full and a free GPU")
    assert status == "ok", placed
    assert "old path:  NVIDIA's time-slicing hands out the GPU with the fewest replicas" in placed
    assert "POST /filter keeps gpu-node" in placed and "bind records GPU-demo-1" in placed

    status, cuda = _step(out, "run a CUDA program under vcuda-run --memory 10Gi --cores 30")
    assert status in ("ok", "skipped")
    if status == "skipped":
        assert "no NVIDIA GPU here" in cuda

    lines = out.strip().splitlines()
    assert lines[-3].startswith("Cleaned up: vcuda-webhook stopped (exit status 0); "
                                "no container left;")
    assert lines[-2] == f"{len(_statuses(out))} steps: {_statuses(out).count('ok')} ok, " \
                        f"0 failed, {_statuses(out).count('skipped')} skipped."
    assert lines[-1].startswith("Try next: ")
    assert _left_behind(tmp_path) == []


def test_a_container_too_big_for_a_small_gpu_is_refused_by_the_hook_as_the_demo_shows(
        tmp_path: Path) -> None:
    inventory = tmp_path / "gpus.json"
    write_inventory(str(inventory), [Gpu("GPU-small", 0, 4 * GIB)])
    done = _demo(tmp_path, "--inventory", str(inventory))
    out = done.stdout
    assert done.returncode == 0, out + done.stderr

    status, notebook = _step(out, "start container demo/shared-notebook/notebook")
    assert status == "ok"
    assert "refused by the hook, as it should be: its GPU has 4.00 GiB and it asks for " \
           "10.00 GiB" in notebook
    assert "vcuda-hook: container demo/shared-notebook/notebook" in notebook
    assert "asks for 10.00 GiB" in notebook and "; fix: " in notebook
    # The other containers still start: 1 GiB fits the 4 GiB GPU.
    assert _step(out, "start container demo/forged-limits/app")[0] == "ok"
    assert "0 failed" in out
    assert _left_behind(tmp_path) == []


def test_an_unreadable_inventory_fails_the_node_step_and_the_containers_are_not_run(
        tmp_path: Path) -> None:
    inventory = tmp_path / "gpus.json"
    inventory.write_text(json.dumps({"version": 7, "gpus": []}))
    done = _demo(tmp_path, "--inventory", str(inventory))
    assert done.returncode == 1
    status, node = _step(done.stdout, "prepare the node")
    assert status == "FAILED" and "--inventory: GPU inventory" in node and "version 7" in node
    status, notebook = _step(done.stdout, "start container demo/shared-notebook/notebook")
    assert status == "skipped" and "the node is not prepared" in notebook
    assert _left_behind(tmp_path) == []


def test_a_python_without_the_webhooks_modules_fails_the_check_and_names_the_fix(
        tmp_path: Path) -> None:
    # A Python that sees the standard library only (-S: no site-packages).
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    done = _demo(tmp_path, python=str(bare))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    status, check = _step(out, "check this machine")
    assert status == "FAILED" and "lacks the Python modules" in check
    assert "aiohttp" in check and "-m pip install" in check
    assert _step(out, "start the admission webhook") == (
        "skipped", "skipped  2. start the admission webhook: not run: see step 1")
    assert _step(out, "prepare the node")[0] == "skipped"
    assert "Traceback" not in done.stderr
    assert _left_behind(tmp_path) == []


def test_without_runc_the_check_fails_the_webhook_part_still_runs_and_the_demo_exits_1(
        tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "TMPDIR": str(_work(tmp_path)), "PATH": str(empty)}
    done = subprocess.run([sys.executable, "-m", "demo"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    status, check = _step(out, "check this machine")
    assert status == "FAILED" and "runc not found: bash scripts/setup installs it" in check
    assert _step(out, "review pod demo/shared-notebook")[0] == "ok"
    assert _step(out, "prepare the node") == (
        "skipped", "skipped  7. prepare the node: not run: see step 1")
    assert _left_behind(tmp_path) == []


_DEFAULT_SIGINT_THEN_DEMO = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'demo'])")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_demo_stops_the_webhook_removes_its_files_and_exits_130(
        tmp_path: Path, signum: signal.Signals) -> None:
    env = {**os.environ, "TMPDIR": str(_work(tmp_path))}
    # As a terminal starts it: tests started in the background by a shell
    # without job control inherit SIGINT ignored, and so would the demo. The
    # default is restored by a launcher that execs the demo, not by preexec_fn:
    # this process runs gRPC's threads, and Python code between fork and exec
    # could hang or die on their state.
    demo = subprocess.Popen([sys.executable, "-c", _DEFAULT_SIGINT_THEN_DEMO], cwd=REPO,
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert demo.stdout is not None
    seen = []
    for line in demo.stdout:
        seen.append(line)
        if "start the admission webhook" in line:
            break
    webhook = re.search(r"\(pid (\d+)\)", seen[-1])
    assert webhook, "".join(seen)
    demo.send_signal(signum)
    rest, _ = demo.communicate(timeout=120)
    out = "".join(seen) + rest
    assert demo.returncode == 130, out
    assert "Cleaned up: vcuda-webhook stopped" in out and "Interrupted after" in out
    assert not Path(f"/proc/{webhook.group(1)}").exists()
    assert _left_behind(tmp_path) == []


@pytest.mark.gpu
def test_on_a_gpu_machine_a_cuda_program_sees_10_gib_and_gets_out_of_memory_past_it(
        tmp_path: Path) -> None:
    done = _demo(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    status, cuda = _step(done.stdout, "run a CUDA program under vcuda-run")
    assert status == "ok", cuda
    assert "sees 10.00 GiB in all" in cuda and "of 10.00 GiB" in cuda
    assert "OutOfMemoryError" in cuda
