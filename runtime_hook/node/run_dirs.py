"""vcuda-run's private directories: believed only when vcuda-run made one for the command it names.

They sit in a directory every user may write (``/tmp``), where anyone can make
one named ``vcuda-run-…``. A directory is taken as the record of a running
command only when all of this holds, U being the user that owns it:

- it is a directory, not a link, that only U may enter (``mkdtemp`` makes it 0700);
- its ``owner`` and ``limits`` are regular files of U, opened without following links;
- the process ``owner`` names lives, with that start time, and its real uid is U;
- that process was started with ``VCUDA_LIMITS_FILE`` naming this very ``limits``
  file (its ``/proc/<pid>/environ``; the path resolved in the process's own root
  and compared by device and inode), as ``vcuda-run`` starts its command.

So one user can say nothing about another's process, and a directory speaks only
for the process that vcuda-run started with it. What the limits say is then
that user's word on their own command.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple

from runtime_hook.contract import RUN_LIMITS_ENV, RUN_LIMITS_FILE, RUN_OWNER_FILE
from runtime_hook.node.planted_files import PlantedFileError, read_regular
from runtime_hook.node_state import process_start_time

_MAX_FILE = 64 << 10  # a limits file is a few lines
_MAX_ENVIRON = 1 << 20  # vcuda-run puts its variable first; an environment may be longer


class RunDir(NamedTuple):
    """A directory that vcuda-run made for a command that runs now: its ``user`` (uid), the
    command's first process (``pid``, ``start_time``), and the text of its ``limits``."""

    user: int
    pid: int
    start_time: int
    limits: bytes


def read(path: str, proc: str) -> RunDir | None:
    """The run dir at ``path`` (as this process sees it); None when its command ended or it is
    not complete yet; ValueError, with the reason, when vcuda-run did not make it for the
    process it names. ``proc``: the host's procfs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # swept meanwhile
    except OSError as exc:
        raise ValueError(f"not a directory vcuda-run made ({exc.strerror})") from None
    try:
        here = os.fstat(fd)
        if here.st_mode & 0o077:
            raise ValueError(f"mode {stat.S_IMODE(here.st_mode):04o}: vcuda-run makes its "
                             "directories 0700")
        user = here.st_uid
        owner = _read_own(fd, RUN_OWNER_FILE, user)
        if owner is None:
            return None  # being created
        pid, start_time = _owner(owner[0])
        if process_start_time(pid, proc) != start_time:
            return None  # ended; the next vcuda-run sweeps the directory
        runs_as = _real_uid(pid, proc)
        if runs_as != user:
            raise ValueError(f"names process {pid}, which runs as uid {runs_as}, and belongs "
                             f"to uid {user}")
        limits = _read_own(fd, RUN_LIMITS_FILE, user)
        if limits is None:
            return None  # being created
        if not _started_with(pid, proc, limits[1]):
            raise ValueError(f"process {pid} was not started with ${RUN_LIMITS_ENV} naming its "
                             "limits file")
        return RunDir(user, pid, start_time, limits[0])
    finally:
        os.close(fd)


def _read_own(directory: int, name: str, user: int) -> tuple[bytes, os.stat_result] | None:
    try:
        return read_regular(name, _MAX_FILE, dir_fd=directory, owner=user)
    except PlantedFileError as exc:
        raise ValueError(f"{name} {exc}") from None


def _owner(text: bytes) -> tuple[int, int]:
    words = text.split()
    if len(words) != 2 or not all(w.isdigit() and len(w) <= 20 for w in words):
        raise ValueError(f"{RUN_OWNER_FILE}: not a pid and a start time")
    return int(words[0]), int(words[1])


def _real_uid(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/status", "rb") as src:
            for line in src:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _started_with(pid: int, proc: str, limits: os.stat_result) -> bool:
    """Whether process ``pid``'s environment names ``limits`` in ``$VCUDA_LIMITS_FILE``."""
    key = RUN_LIMITS_ENV.encode() + b"="
    try:
        with open(f"{proc}/{pid}/environ", "rb") as src:
            environ = src.read(_MAX_ENVIRON)
    except OSError as exc:
        raise ValueError(f"process {pid}'s environment cannot be read ({exc.strerror}): the "
                         "agent needs CAP_SYS_PTRACE") from None
    named = [entry[len(key):] for entry in environ.split(b"\0") if entry.startswith(key)]
    if not named or not named[0].startswith(b"/"):  # getenv takes the first
        return False
    try:  # the path as the process sees it: in its own root
        seen = os.stat(f"{proc}/{pid}/root".encode() + named[0])
    except OSError:
        return False
    return (seen.st_dev, seen.st_ino) == (limits.st_dev, limits.st_ino)
