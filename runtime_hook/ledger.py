"""The node ledger: which limited containers run here and how much GPU memory each holds.

Each limited container owns ``<state>/containers/<id>/``; the directory is the
record. It appears whole (built under a temporary name, then renamed) and holds

    entry.json      who it is, its pid and start time, what it committed
    limits          the rendered limits file, bind-mounted read-only into it
    ld.so.preload   the merged preload list, bind-mounted read-only into it
    account/        a small tmpfs shared read-write with it at /run/vcuda

Changes happen under an exclusive ``flock`` on ``<state>/lock``. A container
whose process is gone (compared by pid *and* start time, so a reused pid does
not count) no longer holds anything: :meth:`Ledger.reconcile` removes it, which
covers hooks that crashed and containers that died without their poststop.

The node agent reads the same records; ``account/`` is writable by the
container, so open files in it with ``O_NOFOLLOW`` and check they are regular.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from runtime_hook import syscalls

ENTRY_FILE = "entry.json"
LIMITS_FILE = "limits"
PRELOAD_FILE = "ld.so.preload"
ACCOUNT_DIR = "account"

_LOCK_POLL = 0.01


class LedgerError(RuntimeError):
    """The state directory cannot be used; the message says why."""


@dataclass(frozen=True)
class Entry:
    """What one limited container committed on this node."""

    container_id: str
    namespace: str
    pod: str
    container: str
    pid: int
    start_time: int
    memory: int
    cores: int
    devices: tuple[str, ...]


def process_start_time(pid: int) -> int | None:
    """Return the start time (clock ticks since boot) of ``pid``, or None when it has exited.

    A zombie has exited too: a killed container whose parent has not reaped it yet.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as src:
            stat = src.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])  # field 22 of proc_pid_stat(5)


def committed_memory(entries: list[Entry]) -> dict[str, int]:
    """Sum the memory committed on each GPU UUID."""
    total: dict[str, int] = {}
    for entry in entries:
        for uuid in entry.devices:
            total[uuid] = total.get(uuid, 0) + entry.memory
    return total


class Ledger:
    """The records under one state directory."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self._containers = os.path.join(state_dir, "containers")

    def container_dir(self, container_id: str) -> str:
        """The directory that holds ``container_id``'s record and files."""
        return os.path.join(self._containers, container_id)

    @contextlib.contextmanager
    def locked(self, timeout: float) -> Iterator[None]:
        """Hold the ledger's lock; raise LedgerError after ``timeout`` seconds of waiting."""
        self._prepare()
        lock = os.path.join(self.state_dir, "lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise LedgerError(
                            f"{self.state_dir}/lock is held for more than {timeout:g}s"
                        ) from None
                    time.sleep(_LOCK_POLL)
            yield
        finally:
            os.close(fd)

    def _prepare(self) -> None:
        os.makedirs(self._containers, mode=0o755, exist_ok=True)
        st = os.stat(self.state_dir)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise LedgerError(
                f"state directory {self.state_dir} must be owned and writable by root only"
            )

    def reconcile(self) -> tuple[list[Entry], list[str]]:
        """Drop records of containers that are gone; return (live entries, dropped ids)."""
        live: list[Entry] = []
        dropped: list[str] = []
        for name in sorted(os.listdir(self._containers)):
            entry = self._read(name)
            if entry is not None and process_start_time(entry.pid) == entry.start_time:
                live.append(entry)
            else:
                self.release(name)
                dropped.append(name)
        return live, dropped

    def _read(self, name: str) -> Entry | None:
        try:
            with open(os.path.join(self._containers, name, ENTRY_FILE), "rb") as src:
                body = json.loads(src.read())
            body["devices"] = tuple(body["devices"])
            return Entry(**body)
        except (OSError, ValueError, TypeError, KeyError):
            return None  # half-built or damaged: nothing can rely on it

    def commit(self, entry: Entry) -> str:
        """Record ``entry``; return its container directory. Raise LedgerError if one exists."""
        final = self.container_dir(entry.container_id)
        building = os.path.join(self._containers, f".new-{os.getpid()}")
        os.mkdir(building, 0o755)
        with open(os.path.join(building, ENTRY_FILE), "w", encoding="utf-8") as out:
            json.dump(asdict(entry), out)
        os.mkdir(os.path.join(building, ACCOUNT_DIR), 0o755)
        try:
            os.rename(building, final)
        except OSError:
            shutil.rmtree(building)
            raise LedgerError(f"{final} already exists") from None
        return final

    def release(self, container_id: str) -> bool:
        """Remove a container's record and files; return whether there was one."""
        path = self.container_dir(container_id)
        if not os.path.lexists(path):
            return False
        with contextlib.suppress(OSError):  # not mounted (a hook crashed before) is fine
            flags = syscalls.MNT_DETACH | syscalls.UMOUNT_NOFOLLOW
            syscalls.umount2(os.path.join(path, ACCOUNT_DIR), flags)
        shutil.rmtree(path, ignore_errors=True)  # rmtree never follows symlinks
        return True
