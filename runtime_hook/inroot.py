"""Opening and creating paths inside a container's root without ever leaving it.

Every lookup is ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)`` from the
root's fd: ``..`` stops at the container's root, and a symbolic link anywhere
on the path is refused (it could lead into a volume the pod shares, where
what vcuda mounts could be renamed away). Missing pieces are created relative to their
already-resolved parent (``mkdirat``, or ``O_CREAT | O_EXCL | O_NOFOLLOW``), so
a symlink planted where something is created fails the call instead of being
followed. Nothing is created in or mounted on a kernel pseudo-filesystem.
Paths are container paths (``/etc/ld.so.preload``).
"""

from __future__ import annotations

import errno
import os
import stat

from runtime_hook import syscalls
from runtime_hook.hook_errors import NodeError

# No symbolic link at all: a path through a link could lead into a volume of the
# pod, where what vcuda mounts could be renamed away from under the container.
_RESOLVE = (
    syscalls.RESOLVE_IN_ROOT | syscalls.RESOLVE_NO_MAGICLINKS | syscalls.RESOLVE_NO_SYMLINKS
)
_CREATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_RETRIES = 8  # openat2 answers EAGAIN when a rename or mount raced a '..' step

# statfs f_type magic numbers of filesystems where creating a file has side
# effects on the host kernel (a cgroup, a sysfs knob) or that only mirror it.
_PSEUDO_FS = {
    0x9FA0: "proc",
    0x62656572: "sysfs",
    0x27E0EB: "cgroup",
    0x63677270: "cgroup2",
    0x73636673: "securityfs",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0xCAFE4A11: "bpf",
    0x62656570: "configfs",
    0xF97CFF8C: "selinuxfs",
    0xDE5E81E4: "efivarfs",
    0x6165676C: "pstore",
    0x65735543: "fusectl",
    0x1CD1: "devpts",
    0x19800202: "mqueue",
    0x6E736673: "nsfs",
}


class InRootError(NodeError):
    """A path in the container cannot be used; the message names it and says why."""


def _lookup(root_fd: int, path: str, flags: int) -> int:
    for _ in range(_RETRIES):
        try:
            relative = path.lstrip("/") or "."
            return syscalls.openat2(root_fd, relative, flags | os.O_CLOEXEC, _RESOLVE)
        except BlockingIOError:
            continue
    raise InRootError(f"{path} keeps changing while it is looked up")


def _explain(path: str, exc: OSError) -> InRootError:
    if exc.errno == errno.ENOENT:
        return InRootError(f"{path} is a symbolic link to nothing inside the container")
    if exc.errno == errno.ENOTDIR:
        return InRootError(f"{path} is not a directory")
    if exc.errno == errno.ELOOP:
        return InRootError(f"{path} is or passes through a symbolic link")
    if exc.errno == errno.EROFS:
        return InRootError(f"{path} is missing and the container's root filesystem is read-only")
    return InRootError(f"{path}: {os.strerror(exc.errno or 0)}")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISREG, "regular file"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _refuse_pseudo(fd: int, path: str) -> None:
    name = _PSEUDO_FS.get(syscalls.fs_type(fd))
    if name:
        raise InRootError(f"{path} lies on {name}, where vcuda creates and mounts nothing")


def _open_step(root_fd: int, path: str, flags: int) -> int:
    try:
        return _lookup(root_fd, path, flags)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise
        raise _explain(path, exc) from None


def open_dir(root_fd: int, path: str) -> int:
    """Return an O_PATH fd of directory ``path``, creating what is missing (mode 0755)."""
    flags = os.O_PATH | os.O_DIRECTORY
    current = _lookup(root_fd, "/", flags)
    parts = [p for p in path.split("/") if p]
    try:
        for i, part in enumerate(parts):
            prefix = "/" + "/".join(parts[: i + 1])
            try:
                step = _open_step(root_fd, prefix, flags)
            except FileNotFoundError:
                _refuse_pseudo(current, os.path.dirname(prefix))
                try:
                    os.mkdir(part, 0o755, dir_fd=current)
                except FileExistsError:
                    pass  # a dangling symlink: the lookup below reports it
                except OSError as exc:
                    raise _explain(prefix, exc) from None
                try:
                    step = _open_step(root_fd, prefix, flags)
                except FileNotFoundError as exc:
                    raise _explain(prefix, exc) from None
            os.close(current)
            current = step
    except BaseException:
        os.close(current)
        raise
    return current


def open_file(root_fd: int, path: str) -> tuple[int, bool]:
    """Return (O_PATH fd of regular file ``path``, whether it existed), creating it empty."""
    parent = open_dir(root_fd, os.path.dirname(path))
    try:
        existed = True
        try:
            fd = _open_step(root_fd, path, os.O_PATH)
        except FileNotFoundError:
            existed = False
            _refuse_pseudo(parent, os.path.dirname(path))
            try:
                os.close(os.open(os.path.basename(path), _CREATE_FILE, 0o644, dir_fd=parent))
            except FileExistsError:
                pass  # a dangling symlink: the lookup below reports it
            except OSError as exc:
                raise _explain(path, exc) from None
            try:
                fd = _open_step(root_fd, path, os.O_PATH)
            except FileNotFoundError as exc:
                raise _explain(path, exc) from None
    finally:
        os.close(parent)
    try:
        require(fd, path, directory=False)
    except BaseException:
        os.close(fd)
        raise
    return fd, existed


def require(fd: int, path: str, directory: bool) -> None:
    """Raise InRootError unless ``fd`` is a directory (or a regular file) off pseudo-filesystems."""
    mode = os.fstat(fd).st_mode
    wanted = stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)
    if not wanted:
        expected = "a directory" if directory else "a regular file"
        raise InRootError(f"{path} is a {_kind(mode)}, expected {expected}")
    _refuse_pseudo(fd, path)


def read_regular(root_fd: int, path: str, limit: int) -> bytes:
    """Return the content of regular file ``path``; refuse anything else or over ``limit`` bytes."""
    try:
        fd = _lookup(root_fd, path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise _explain(path, exc) from None
    try:
        require(fd, path, directory=False)
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InRootError(f"{path} is larger than {limit} bytes")
    return data


def stat_path(root_fd: int, path: str) -> os.stat_result:
    """Return the stat of what ``path`` leads to inside the root."""
    try:
        fd = _lookup(root_fd, path, os.O_PATH)
    except OSError as exc:
        raise _explain(path, exc) from None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)
