"""The node ledger and the GPU inventory: records survive crashes, dead containers hold nothing."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
from pathlib import Path

import pytest

from runtime_hook.contract import Gpu, InventoryError, read_inventory, write_inventory
from runtime_hook.ledger import DuplicateError, Entry, commit, committed, entries, sharers
from runtime_hook.node_state import ACCOUNT_DIR, StateDir, StateError, process_start_time
from tests.hook.bundles import mounts_under

GIB = 1 << 30


def test_inventory_round_trips(tmp_path: Path) -> None:
    gpus = [Gpu("GPU-a", 0, 16 * GIB), Gpu("GPU-b", 1, 80 * GIB)]
    write_inventory(str(tmp_path / "gpus.json"), gpus)
    assert read_inventory(str(tmp_path / "gpus.json")) == {"GPU-a": gpus[0], "GPU-b": gpus[1]}
    assert [p.name for p in tmp_path.iterdir()] == ["gpus.json"]  # no temporary file left


def test_missing_inventory_reads_as_none(tmp_path: Path) -> None:
    assert read_inventory(str(tmp_path / "absent.json")) is None


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"version": 2, "gpus": []}',
        '{"version": 1}',
        '{"version": 1, "gpus": [{"uuid": "GPU-a", "index": 0}]}',
        '{"version": 1, "gpus": [{"uuid": "", "index": 0, "memory": 1}]}',
        '{"version": 1, "gpus": [{"uuid": "GPU-a", "index": -1, "memory": 1}]}',
        '{"version": 1, "gpus": [{"uuid": "GPU-a", "index": 0, "memory": true}]}',
    ],
)
def test_malformed_inventory_is_an_error_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(text)
    with pytest.raises(InventoryError, match=f"GPU inventory {path}"):
        read_inventory(str(path))


def _entry(cid: str, pid: int, start: int | None, memory: int = GIB, devices=("GPU-a",)) -> Entry:
    return Entry(
        container_id=cid,
        namespace="ns",
        pod="pod",
        container="c",
        pid=pid,
        start_time=start if start is not None else -1,
        memory=memory,
        cores=30,
        devices=tuple(devices),
    )


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    (tmp_path / "state").mkdir(mode=0o755)
    return StateDir(str(tmp_path / "state"))


def _exited_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_records_read_back_as_committed(state: StateDir) -> None:
    me = os.getpid()
    entry = _entry("c1", me, process_start_time(me), devices=("GPU-a", "GPU-b"))
    with state.locked(1):
        record = commit(state, entry)
    assert entries(state) == [entry]
    assert sorted(os.listdir(record)) == ["account", "entry", "owner"]


def test_live_containers_stay_and_gone_ones_are_released(state: StateDir) -> None:
    me = os.getpid()
    with state.locked(1):
        commit(state, _entry("alive", me, process_start_time(me), memory=3 * GIB))
        commit(state, _entry("exited", _exited_pid(), 1))
        commit(state, _entry("pid-reused", me, (process_start_time(me) or 0) + 1))
        gone = state.release_gone()
    assert gone == ["exited", "pid-reused"]
    assert [e.container_id for e in entries(state)] == ["alive"]
    assert committed(entries(state)) == {"GPU-a": (3 * GIB, 30)}
    assert os.listdir(state.containers) == ["alive"]


def test_zombie_counts_as_gone() -> None:
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
    try:
        assert process_start_time(child.pid) is None
    finally:
        child.wait()


def test_records_a_crashed_hook_left_half_built_are_released(state: StateDir) -> None:
    containers = Path(state.containers)
    with state.locked(1):
        (containers / ".new-999").mkdir()
        (containers / "damaged").mkdir()
        (containers / "damaged" / "owner").write_text("not a pid\n")
        (containers / "damaged" / "odd-dir").mkdir()  # removed all the same
        assert state.release_gone() == [".new-999", "damaged"]
    assert list(containers.iterdir()) == []


def test_a_container_is_committed_once(state: StateDir) -> None:
    me = os.getpid()
    with state.locked(1):
        commit(state, _entry("c1", me, process_start_time(me)))
        with pytest.raises(DuplicateError, match="exists already"):
            commit(state, _entry("c1", me, process_start_time(me)))
    assert os.listdir(state.containers) == ["c1"]  # the second attempt left nothing behind


def test_committed_memory_and_cores_add_up_per_gpu() -> None:
    records = [
        _entry("a", 1, 1, memory=GIB, devices=("GPU-a", "GPU-b")),
        _entry("b", 1, 1, memory=2 * GIB, devices=("GPU-a",)),
    ]
    assert committed(records) == {"GPU-a": (3 * GIB, 60), "GPU-b": (GIB, 30)}


def test_sharers_count_the_containers_on_each_gpu() -> None:
    records = [_entry(name, 1, 1, devices=devices) for name, devices in
               (("a", ("GPU-a", "GPU-b")), ("b", ("GPU-a",)), ("c", ("GPU-a",)))]
    assert sharers(records) == {"GPU-a": 3, "GPU-b": 1}


def test_lock_held_elsewhere_times_out_with_a_clear_error(state: StateDir) -> None:
    with state.locked(1):
        pass  # creates the lock file
    holder = os.open(os.path.join(state.path, "lock"), os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(StateError, match=r"held for more than 0\.1s"), state.locked(0.1):
            pass
    finally:
        os.close(holder)


def test_missing_state_dir_is_created_root_only_whatever_the_umask(tmp_path: Path) -> None:
    state = StateDir(str(tmp_path / "run" / "vcuda"))
    old = os.umask(0)
    try:
        with state.locked(1):
            pass
    finally:
        os.umask(old)
    for path in (state.path, state.containers):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755


def test_state_dir_writable_by_others_is_refused(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(StateError, match="owned and writable by root only"):
        StateDir(str(tmp_path / "open")).locked(1)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_release_unmounts_the_account_tmpfs(state: StateDir) -> None:
    me = os.getpid()
    with state.locked(1):
        record = commit(state, _entry("c1", me, process_start_time(me)))
    account = os.path.join(record, ACCOUNT_DIR)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", account], check=True)
    Path(account, "account").write_text("in use")
    with state.locked(1):
        state.release("c1")
    assert not os.path.lexists(record)
    assert mounts_under(Path(state.path)) == []
