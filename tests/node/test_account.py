"""Reading the shim's shared account: files of a real shim process, and files that are not one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime_hook.node.account import AccountError, read
from tests.node.accounts import SIZE, account_bytes, write_account
from tests.shim.harness import CONTEXT, GIB, FakeGpu, account_used, fake_uuid


def test_the_account_of_real_shim_processes_reads_as_the_shims_own_figures(
    two_gpus: FakeGpu,
) -> None:
    two_gpus.limit(4 * GIB)
    holds = ("init", "ctx", "0", "alloc", "1G", "ctx", "1", "alloc", "2G", "wait")
    with two_gpus.running(*holds) as first, two_gpus.running("init", "ctx", "0", "alloc", "512M",
                                                             "wait") as second:
        account = read(str(two_gpus.account))
        assert account is not None
        assert account.devices == (fake_uuid(0), fake_uuid(1))
        assert {slot.pid for slot in account.slots} == {first.process.pid, second.process.pid}
        assert account.used() == account_used(two_gpus.account)
        assert account.used() == {fake_uuid(0): 2 * CONTEXT + GIB + 512 * (1 << 20),
                                  fake_uuid(1): CONTEXT + 2 * GIB}
        # Only the slots of the processes named count.
        [mine] = [s for s in account.slots if s.pid == second.process.pid]
        assert account.used({(mine.pid, mine.start_time)}) == {
            fake_uuid(0): CONTEXT + 512 * (1 << 20), fake_uuid(1): 0}


def test_an_account_written_from_the_documented_layout_reads_back(tmp_path: Path) -> None:
    path = write_account(tmp_path / "account", ["GPU-a", "GPU-b"],
                         [(7, 100, [5, 6]), (0, 0, [99, 99]), (9, 200, [1, 0])])
    account = read(str(path))
    assert account is not None
    assert account.devices == ("GPU-a", "GPU-b")
    assert [(s.pid, s.start_time, s.used) for s in account.slots] == [(7, 100, (5, 6)),
                                                                       (9, 200, (1, 0))]
    assert account.used() == {"GPU-a": 6, "GPU-b": 6}


def test_a_missing_account_means_no_process_used_cuda_yet(tmp_path: Path) -> None:
    assert read(str(tmp_path / "account")) is None


def _damaged(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


GOOD = account_bytes(["GPU-a"], [(7, 100, [5])])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "has 0 bytes, an account has 151552"),
        (GOOD[:4096], "has 4096 bytes, an account has 151552"),
        (_damaged(GOOD, 0, b"NOTVCUDA"), "is not a vcuda account (magic b'NOTVCUDA')"),
        (_damaged(GOOD, 8, (3).to_bytes(4, "little")), "has layout version 3"),
        (_damaged(GOOD, 20, (200).to_bytes(4, "little")), "has layout version 2 (4096, 16, 200"),
        (_damaged(GOOD, 40, (17).to_bytes(4, "little")), "claims 17 devices and 1 slots"),
        (_damaged(GOOD, 44, (5000).to_bytes(4, "little")), "claims 1 devices and 5000 slots"),
    ],
)
def test_a_file_that_is_not_an_account_is_refused_with_the_reason(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "account"
    path.write_bytes(content)
    with pytest.raises(AccountError) as caught:
        read(str(path))
    assert str(caught.value).startswith(f"{path} {message}")


def test_an_account_that_a_container_replaced_by_a_symlink_is_not_followed(tmp_path: Path) -> None:
    real = write_account(tmp_path / "elsewhere", ["GPU-a"], [(7, 100, [5])])
    (tmp_path / "account").symlink_to(real)
    with pytest.raises(AccountError, match="cannot be opened"):
        read(str(tmp_path / "account"))


def test_an_account_that_is_a_fifo_or_a_directory_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    for name in ("fifo", "dir"):
        with pytest.raises(AccountError, match=r"is not a regular file|cannot be opened"):
            read(str(tmp_path / name))


def test_a_larger_file_is_read_only_as_far_as_an_account_goes(tmp_path: Path) -> None:
    path = tmp_path / "account"
    path.write_bytes(GOOD + b"\xff" * SIZE)
    account = read(str(path))
    assert account is not None and account.used() == {"GPU-a": 5}
