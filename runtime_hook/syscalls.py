"""Linux system calls the hook needs that Python's os module lacks, through CPython's _ctypes.

openat2, open_tree, move_mount and mount_setattr have the same numbers on every
64-bit architecture Linux supports (they were added after the tables were
unified), so no per-architecture table is needed. Linux 5.12 or later.

The calls go through ``_ctypes``, the C core of ``ctypes``, directly: the
``ctypes`` package around it builds dozens of types and a callback thunk on
import, which cost each limited container's start about 3 ms per stage. The
few pieces of ``_ctypes`` used here are those ``ctypes`` itself is built on.
"""

from __future__ import annotations

import _ctypes
import os
import sys

TYPE_CHECKING = False  # typing's, without importing typing (the hook's start-up cost)
if TYPE_CHECKING:
    from ctypes import CDLL


class _Int(_ctypes._SimpleCData):
    _type_ = "i"


class _Long(_ctypes._SimpleCData):
    _type_ = "l"


class _Longs(_ctypes.Array):
    _type_ = _Long
    _length_ = 32  # 256 bytes: larger than struct statfs on every ABI


_FLAGS = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO  # errno saved right after the call


class _IntFunction(_ctypes.CFuncPtr):
    _flags_ = _FLAGS
    _restype_ = _Int


class _LongFunction(_ctypes.CFuncPtr):
    _flags_ = _FLAGS
    _restype_ = _Long


class _Process:
    """This process's own symbols, libc's among them: CFuncPtr looks names up in ``_handle``."""

    _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]  # None: this process, as dlopen(3)


# All a CFuncPtr reads of its library is ``_handle``: _Process stands in for a CDLL.
_PROCESS: CDLL = _Process  # type: ignore[assignment]
_syscall = _LongFunction(("syscall", _PROCESS))
_setns = _IntFunction(("setns", _PROCESS))
_mount = _IntFunction(("mount", _PROCESS))
_umount2 = _IntFunction(("umount2", _PROCESS))
_fstatfs = _IntFunction(("fstatfs", _PROCESS))

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_OPENAT2 = 437
_SYS_MOUNT_SETATTR = 442

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10

OPEN_TREE_CLONE = 0x1
AT_RECURSIVE = 0x8000
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


def _u64s(*values: int) -> bytes:
    """A C struct of __u64 fields, as the kernel reads it (_ctypes passes bytes by address)."""
    return b"".join(value.to_bytes(8, sys.byteorder) for value in values)


def _check(result: int, what: str, path: str = "") -> int:
    if result < 0:
        err = _ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}", path or None)
    return result


def openat2(dirfd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """Open ``path`` relative to ``dirfd`` under the ``resolve`` restrictions; return the fd."""
    how = _u64s(flags, mode, resolve)  # struct open_how
    fd = _syscall(_SYS_OPENAT2, dirfd, os.fsencode(path), how, len(how))
    return _check(fd, "openat2", path)


def open_tree(dirfd: int, path: str, flags: int) -> int:
    """Return an fd for the mount at ``path`` (a detached copy with OPEN_TREE_CLONE)."""
    return _check(_syscall(_SYS_OPEN_TREE, dirfd, os.fsencode(path), flags), "open_tree", path)


def move_mount(from_fd: int, to_fd: int) -> None:
    """Attach the detached mount ``from_fd`` on top of the file or directory ``to_fd``."""
    flags = MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH
    _check(_syscall(_SYS_MOVE_MOUNT, from_fd, b"", to_fd, b"", flags), "move_mount")


def mount_setattr(fd: int, attr_set: int) -> None:
    """Set the MOUNT_ATTR_* flags ``attr_set`` on the mount behind ``fd``."""
    attr = _u64s(attr_set, 0, 0, 0)  # struct mount_attr: set, clear, propagation, userns fd
    _check(_syscall(_SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, attr, len(attr)), "mount_setattr")


def setns(fd: int, nstype: int) -> None:
    """Move the calling (single-threaded) process into the namespace behind ``fd``."""
    _check(_setns(fd, nstype), "setns")


def mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    """mount(2) with the classic API (used for the host-side tmpfs)."""
    result = _mount(
        os.fsencode(source), os.fsencode(target), os.fsencode(fstype), flags, os.fsencode(data)
    )
    _check(result, "mount", target)


def umount2(target: str, flags: int) -> None:
    """umount2(2)."""
    _check(_umount2(os.fsencode(target), flags), "umount2", target)


def fs_type(fd: int) -> int:
    """Return the f_type magic number of the filesystem holding ``fd`` (fstatfs)."""
    buf = _Longs()
    _check(_fstatfs(fd, buf), "fstatfs")
    return buf[0]  # f_type, the struct's first field
