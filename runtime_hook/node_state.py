"""The hook's state directory: its layout, its lock, and releasing containers that are gone.

    <state>/lock                   flock'ed by every hook that changes what is below
    <state>/containers/<id>/       one limited container, written whole (ledger.py)
        owner                      "<pid> <start time>" of its first process
        entry.json                 what it committed (ledger.py)
        limits, ld.so.preload      the files bind-mounted read-only into it
        account/                   a small tmpfs shared read-write with it at /run/vcuda
    <state>/refused-starts         a byte appended at each start the hook refused: its size
                                   counts them for the node agent's metrics

A container is gone when the process in ``owner`` has exited, or its pid now
belongs to a process with another start time (pid reuse). A record whose
owner is pid 0 belongs to no process: a DRA claim that the node agent's
kubelet plugin prepared, released only when kubelet unprepares it. Releasing a gone
container is how poststop works, and how hooks that crashed or containers
that died without their poststop stop holding GPU memory.

Of the standard library only ``os``, ``fcntl`` and ``time`` at import:
poststop runs nothing else.
"""

from __future__ import annotations

import fcntl
import os
import time

from runtime_hook.hook_errors import NodeError

OWNER_FILE = "owner"
LIMITS_FILE = "limits"
PRELOAD_FILE = "ld.so.preload"
ACCOUNT_DIR = "account"
REFUSALS_FILE = "refused-starts"
CLAIM_OWNER_PID = 0  # owner of a DRA claim's record: no process, released by unprepare

_LOCK_POLL = 0.01


class StateError(NodeError, RuntimeError):
    """The state directory cannot be used; the message says why."""

    fix = "check the hook's --state-dir on this node"


def process_start_time(pid: int, proc: str = "/proc") -> int | None:
    """Return the start time (clock ticks since boot) of ``pid``, or None when it has exited.

    A zombie has exited too: a killed container whose parent has not reaped it yet.
    ``proc``: the procfs that numbers processes as ``pid`` does (the host's, under the
    node agent's host root).
    """
    try:
        with open(f"{proc}/{pid}/stat", "rb") as src:
            stat = src.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])  # field 22 of proc_pid_stat(5)


class _Lock:
    def __init__(self, path: str, timeout: float) -> None:
        self._path = path
        self._timeout = timeout
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self._fd)
                    raise StateError(
                        f"{self._path} is held for more than {self._timeout:g}s"
                    ) from None
                time.sleep(_LOCK_POLL)

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)  # closing drops the flock


class StateDir:
    """One state directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.containers = os.path.join(path, "containers")
        self.refusals = os.path.join(path, REFUSALS_FILE)

    def count_refusal(self) -> None:
        """Count one refused start; a failure to count is let go (the refusal stands)."""
        try:
            os.makedirs(self.path, mode=0o755, exist_ok=True)
            # O_APPEND: hooks that refuse at once each add their byte, with no lock.
            fd = os.open(self.refusals, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o600)
        except OSError:
            return
        try:
            os.write(fd, b".")
        except OSError:
            pass
        finally:
            os.close(fd)

    def refused_starts(self) -> int:
        """How many starts the hook has refused since the state dir was made (0: none)."""
        try:
            return os.stat(self.refusals).st_size
        except FileNotFoundError:
            return 0

    def container_dir(self, container_id: str) -> str:
        """The directory of ``container_id``'s record and files."""
        return os.path.join(self.containers, container_id)

    def locked(self, timeout: float) -> _Lock:
        """The exclusive lock, as a context manager; StateError after ``timeout`` seconds."""
        # makedirs gives the mode to the last level only: make each level ours.
        os.makedirs(self.path, mode=0o755, exist_ok=True)
        os.makedirs(self.containers, mode=0o755, exist_ok=True)
        st = os.stat(self.path)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise StateError(f"state directory {self.path} must be owned and writable by root only")
        return _Lock(os.path.join(self.path, "lock"), timeout)

    def is_gone(self, name: str) -> bool:
        """Whether the container recorded as ``name`` has no running process any more."""
        try:
            with open(os.path.join(self.containers, name, OWNER_FILE), "rb") as src:
                pid, start = (int(word) for word in src.read().split())
        except (OSError, ValueError):
            return True  # half-built or damaged: nothing can rely on it
        if pid == CLAIM_OWNER_PID:
            return False
        return process_start_time(pid) != start

    def release_gone(self) -> list[str]:
        """Release every container that is gone (hold the lock); return their ids."""
        gone = [name for name in sorted(os.listdir(self.containers)) if self.is_gone(name)]
        for name in gone:
            self.release(name)
        return gone

    def release(self, container_id: str) -> None:
        """Unmount the container's account tmpfs and remove its directory (hold the lock)."""
        path = self.container_dir(container_id)
        account = os.path.join(path, ACCOUNT_DIR)
        if os.path.ismount(account):
            from runtime_hook import syscalls  # ctypes only when there is something to unmount

            syscalls.umount2(account, syscalls.MNT_DETACH | syscalls.UMOUNT_NOFOLLOW)
        try:  # the layout is known and flat: no need for shutil
            for name in os.listdir(path):
                if name == ACCOUNT_DIR:
                    os.rmdir(os.path.join(path, name))
                else:
                    os.unlink(os.path.join(path, name))
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:
            import shutil  # something unexpected inside: rmtree never follows symlinks

            shutil.rmtree(path, ignore_errors=True)
