"""The shim costs nothing where CUDA is not used, survives fork, stays quiet, and fails closed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.shim.harness import CONTEXT, GIB, LIBRARY, MIB, TESTS, FakeGpu, info


def test_a_process_that_never_calls_cuda_gets_no_threads_files_or_driver(
    gpu: FakeGpu, tmp_path: Path
) -> None:
    # Reading this limits file would block forever: no writer ever opens the pipe.
    fifo = tmp_path / "limits-pipe"
    os.mkfifo(fifo)
    env = dict(gpu.env, LD_PRELOAD=str(LIBRARY), VCUDA_LIMITS_FILE=str(fifo))
    result = subprocess.run(
        [str(TESTS / "idle")], env=env, capture_output=True, text=True, timeout=20, check=True
    )
    assert result.stdout.split() == [
        "threads=1",
        "fds=3",
        "libcuda=0",
        "libnvidia-ml=0",
        "cos=1",
        "unrelated=none",
    ]
    assert result.stderr == ""
    assert not gpu.account.exists()


def test_the_shim_is_silent_unless_a_log_level_asks(gpu: FakeGpu) -> None:
    gpu.limit(1 * GIB)
    assert gpu.run("init", "ctx", "0", "fill", "256M", "nvml").stderr == ""
    chatty = gpu.run("init", "ctx", "0", "fill", "256M", VCUDA_LOG_LEVEL="info").stderr
    assert "refused 268435456 bytes" in chatty
    assert f"limits from {gpu.env['VCUDA_LIMITS_FILE']}" in chatty


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("version=1\nmemory=lots\n", "memory and cores must be whole numbers"),
        ("version=7\nmemory=1\n", "version must be 1"),
        (None, "cannot read"),
    ],
)
def test_a_limits_file_that_cannot_be_honoured_refuses_cuda_and_says_why(
    gpu: FakeGpu, text: str | None, reason: str
) -> None:
    path = gpu.limit(1 * GIB)
    if text is None:
        path.unlink()
    else:
        path.write_text(text)
    result = gpu.run("init", "nvml")
    assert result.stdout.splitlines()[0] == "init CUDA_ERROR_NOT_PERMITTED"
    assert result.stdout.splitlines()[1].split()[3] == "4"  # NVML_ERROR_NO_PERMISSION
    assert f"{path}" in result.stderr and reason in result.stderr


def test_a_forked_child_has_its_own_slot_and_the_parent_keeps_its_own(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines(
        "init", "ctx", "0", "alloc", "1G", "fork", "init;ctx 0;alloc 1G;info", "info"
    )
    child_free, _ = info([line[1:] for line in lines if line[0] == "child"])
    assert child_free == 4 * GIB - 2 * (CONTEXT + 1 * GIB)
    assert ["fork", "0"] in lines
    # The child ended: only the parent's memory counts.
    assert info(lines)[0] == 4 * GIB - CONTEXT - 1 * GIB


def test_forks_while_another_thread_allocates_never_deadlock(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    forks = []
    for _ in range(20):
        forks += ["fork", "nvml;init;ctx 0;alloc 64M;info"]
    lines = gpu.lines("init", "ctx", "0", "hammer", "16M", *forks, "hammer", "0", "info")
    assert [line for line in lines if line[0] == "fork"] == [["fork", "0"]] * 20
    children = [line[1:] for line in lines if line[0] == "child" and line[1] == "info"]
    assert len(children) == 20
    assert all(int(free) <= 4 * GIB - 2 * CONTEXT - 64 * MIB for _, _, free, _ in children)
    assert info(lines)[0] == 4 * GIB - CONTEXT


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare"
)


@needs_root
def test_the_containers_limits_file_wins_over_the_environment(gpu: FakeGpu, tmp_path: Path) -> None:
    etc = tmp_path / "etc-vcuda"
    etc.mkdir()
    (etc / "limits").write_text(f"version=1\nmemory={2 * GIB}\naccount={tmp_path / 'acct'}\n")
    gpu.limit(6 * GIB)
    made = not Path("/etc/vcuda").exists()
    Path("/etc/vcuda").mkdir(exist_ok=True)
    try:
        # A private mount namespace: /etc/vcuda is replaced for this command only.
        script = f'mount --bind {etc} /etc/vcuda && exec "$@"'
        result = subprocess.run(
            ["unshare", "--mount", "sh", "-c", script, "sh", *gpu.command("init", "total", "0")],
            env=gpu.environment(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        if made:
            Path("/etc/vcuda").rmdir()
    if "unshare failed" in result.stderr or "mount:" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()}")
    assert result.stdout.splitlines()[1] == f"total CUDA_SUCCESS {2 * GIB}"
