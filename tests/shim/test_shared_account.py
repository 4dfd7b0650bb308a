"""All processes of a container share one account; dead processes stop counting at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.shim.harness import (
    CONTEXT,
    GIB,
    LOCK_AT,
    MIB,
    FakeGpu,
    account_used,
    fake_uuid,
    info,
    start_time,
    write_slot,
)

HOLDS_3G = ("init", "ctx", "0", "alloc", "3G", "wait")


def test_a_second_process_gets_out_of_memory_when_the_shared_account_is_full(
    gpu: FakeGpu,
) -> None:
    gpu.limit(4 * GIB)
    with gpu.running(*HOLDS_3G):
        lines = gpu.lines("init", "ctx", "0", "alloc", "3G", "info")
        assert lines[2] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
        free, _ = info(lines)
        assert free == 4 * GIB - 2 * CONTEXT - 3 * GIB


def test_processes_with_different_accounts_do_not_share(gpu: FakeGpu, tmp_path) -> None:
    gpu.limit(4 * GIB)
    with gpu.running(*HOLDS_3G):
        other = FakeGpu(tmp_path / "other")
        other.root.mkdir()
        other.env["VCUDA_FAKE_STATE"] = gpu.env["VCUDA_FAKE_STATE"]
        other.limit(4 * GIB)
        assert other.lines("init", "ctx", "0", "alloc", "3G")[2][:2] == ["alloc", "CUDA_SUCCESS"]


def test_after_a_sigkill_the_retry_of_the_other_process_succeeds(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    retrying = ("init", "ctx", "0", "alloc", "3G", "wait", "alloc", "3G")
    with gpu.running(*HOLDS_3G) as first, gpu.running(*retrying) as second:
        assert second.lines[2] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        assert second.resume()[0][:2] == ["alloc", "CUDA_SUCCESS"]


def test_a_killed_process_stops_counting_in_queries_within_a_second(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    with gpu.running(*HOLDS_3G) as first, gpu.running("init", "ctx", "0", "wait", "info") as second:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        time.sleep(1.0)
        assert info(second.resume()) == (4 * GIB - CONTEXT, 4 * GIB)


def test_a_process_that_exits_stops_counting_at_once(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    gpu.run("init", "ctx", "0", "alloc", "3G")
    assert account_used(gpu.account) == {fake_uuid(0): 0}


def test_a_slot_whose_pid_now_belongs_to_another_process_is_reclaimed(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    gpu.run("init")
    with subprocess.Popen(["sleep", "30"]) as stranger:
        # A dead process left 3 GiB under a pid that a new process has since taken.
        write_slot(gpu.account, 0, stranger.pid, start_time(stranger.pid) - 1, 3 * GIB)
        try:
            assert gpu.lines("init", "ctx", "0", "alloc", "3G")[2][:2] == ["alloc", "CUDA_SUCCESS"]
        finally:
            stranger.kill()


def test_a_slot_of_a_live_process_keeps_counting(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    gpu.run("init")
    with subprocess.Popen(["sleep", "30"]) as holder:
        write_slot(gpu.account, 0, holder.pid, start_time(holder.pid), 3 * GIB)
        try:
            lines = gpu.lines("init", "ctx", "0", "alloc", "3G")
            assert lines[2] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
        finally:
            holder.kill()


LOCK_AND_DIE = """
import ctypes, mmap, os, signal, sys
with open(sys.argv[1], "r+b") as f:
    region = mmap.mmap(f.fileno(), 0)
lock = ctypes.c_char.from_buffer(region, int(sys.argv[2]))
assert ctypes.CDLL(None).pthread_mutex_lock(ctypes.byref(lock)) == 0
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_while_holding_the_account_lock_does_not_block_the_others(
    gpu: FakeGpu,
) -> None:
    gpu.limit(4 * GIB)
    gpu.run("init", "ctx", "0")
    died = subprocess.run([sys.executable, "-c", LOCK_AND_DIE, str(gpu.account), str(LOCK_AT)])
    assert died.returncode == -signal.SIGKILL
    result = gpu.run("init", "ctx", "0", "alloc", "3G", VCUDA_LOG_LEVEL="info")
    assert result.stdout.splitlines()[2].startswith("alloc CUDA_SUCCESS")
    assert "died holding the account lock" in result.stderr


def test_processes_killed_in_the_middle_of_allocations_leave_nothing_counted(
    gpu: FakeGpu,
) -> None:
    gpu.limit(4 * GIB)
    for _ in range(5):
        with gpu.running("init", "ctx", "0", "hammer", "64M", "wait") as busy:
            time.sleep(0.05)
            busy.process.send_signal(signal.SIGKILL)
            busy.process.wait()
    lines = gpu.lines("init", "ctx", "0", "fill", "256M")
    assert lines[2] == ["fill", str((4 * GIB - CONTEXT) // (256 * MIB)), "CUDA_ERROR_OUT_OF_MEMORY"]


def test_an_account_file_of_another_kind_refuses_cuda_with_a_message(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    gpu.account.write_bytes(b"not an account" * 20000)
    result = gpu.run("init")
    assert result.stdout.split() == ["init", "CUDA_ERROR_NOT_PERMITTED"]
    assert f"{gpu.account}: not a vcuda account file" in result.stderr
    assert os.path.getsize(gpu.account) == len(b"not an account" * 20000)


def test_the_account_is_created_for_every_user_of_the_container(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    gpu.run("init", "ctx", "0")
    assert gpu.account.stat().st_mode & 0o777 == 0o666
