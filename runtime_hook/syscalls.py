"""Linux system calls the hook needs that Python's os module lacks, through ctypes.

openat2, open_tree, move_mount and mount_setattr have the same numbers on every
64-bit architecture Linux supports (they were added after the tables were
unified), so no per-architecture table is needed. Linux 5.12 or later.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_OPENAT2 = 437
_SYS_MOUNT_SETATTR = 442

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10

OPEN_TREE_CLONE = 0x1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC

MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

CLONE_NEWNS = 0x00020000


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _check(result: int, what: str, path: str = "") -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", path or None)
    return result


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """Open ``path`` relative to ``dirfd`` under the ``resolve`` restrictions; return the fd."""
    how = _OpenHow(flags, mode, resolve)
    fd = _libc.syscall(
        _SYS_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how)
    )
    return _check(fd, "openat2", path)


def open_tree(dirfd: int, path: str, flags: int) -> int:
    """Return an fd for the mount at ``path`` (a detached copy with OPEN_TREE_CLONE)."""
    return _check(_libc.syscall(_SYS_OPEN_TREE, dirfd, os.fsencode(path), flags), "open_tree", path)


def move_mount(from_fd: int, to_fd: int) -> None:
    """Attach the detached mount ``from_fd`` on top of the file or directory ``to_fd``."""
    flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH
    _check(_libc.syscall(_SYS_MOVE_MOUNT, from_fd, b"", to_fd, b"", flags), "move_mount")


def mount_setattr(fd: int, attr_set: int) -> None:
    """Set the MOUNT_ATTR_* flags ``attr_set`` on the mount behind ``fd``."""
    attr = _MountAttr(attr_set, 0, 0, 0)
    result = _libc.syscall(
        _SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    _check(result, "mount_setattr")


def setns(fd: int, nstype: int) -> None:
    """Move the calling (single-threaded) process into the namespace behind ``fd``."""
    _check(_libc.setns(fd, nstype), "setns")


def mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    """mount(2) with the classic API (used for the host-side tmpfs)."""
    result = _libc.mount(
        os.fsencode(source), os.fsencode(target), os.fsencode(fstype), flags, os.fsencode(data)
    )
    _check(result, "mount", target)


def umount2(target: str, flags: int) -> None:
    """umount2(2)."""
    _check(_libc.umount2(os.fsencode(target), flags), "umount2", target)


def fs_type(fd: int) -> int:
    """Return the f_type magic number of the filesystem holding ``fd`` (fstatfs)."""
    buf = ctypes.create_string_buffer(256)  # larger than struct statfs on every ABI
    _check(_libc.fstatfs(fd, buf), "fstatfs")
    return ctypes.c_long.from_buffer(buf).value
