"""Makes the shim active in a container: bind mounts made from inside its mount namespace.

The host files are cloned as detached mounts (``open_tree``) and made
read-only (``mount_setattr``) while still in the host's namespace; a forked
child then joins the container's mount namespace and attaches them
(``move_mount``) on mountpoints found or created with :mod:`runtime_hook.inroot`.
The image's files are never written; the container sees

    /usr/local/vcuda/lib/libvcuda.so  the node's library (read-only)
    /etc/vcuda/limits                 the rendered limits (read-only)
    /etc/ld.so.preload                the library, then the image's own entries (read-only)
    /run/vcuda                        the account directory (read-write, shared by its processes)

runc runs prestart hooks before ``pivot_root``: the root still sits at its host
path in the container's namespace. crun may have pivoted already. Either way
the root is the directory whose device and inode match ``root.path`` on the host.
"""

from __future__ import annotations

import os

# collections.abc re-exports Callable from _collections_abc, which os has
# loaded already; importing collections.abc would load all of collections (2 ms).
from _collections_abc import Callable

from runtime_hook import inroot, syscalls
from runtime_hook.contract import ACCOUNT_MOUNT, LIMITS_PATH
from runtime_hook.hook_errors import HookError
from runtime_hook.record import Record

LIBRARY_PATH = "/usr/local/vcuda/lib/libvcuda.so"
PRELOAD_PATH = "/etc/ld.so.preload"
PRELOAD_LIMIT = 64 << 10

_READ_ONLY = syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV
_DATA_ONLY = _READ_ONLY | syscalls.MOUNT_ATTR_NOEXEC
_ACCOUNT = syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_NOEXEC

_IMAGE, _NODE = b"I", b"N"
_FIX_IMAGE = "make that path absent, or a plain file or directory inside the image"
_FIX_NODE = (
    "run the hook as root on Linux 5.12 or later (openat2, open_tree, move_mount, mount_setattr)"
)


class Sources(Record):
    """Host paths of what goes into the container (``preload`` is filled here)."""

    _fields = ("library", "limits", "preload", "account_dir")
    __slots__ = _fields
    library: str
    limits: str
    preload: str
    account_dir: str


def merge_preload(existing: bytes, library: str = LIBRARY_PATH) -> bytes:
    """The preload list: the library first (so its symbols win), then the image's entries."""
    lib = library.encode()
    if lib in existing.replace(b":", b" ").split():
        return existing
    return lib + b"\n" + existing


def install(pid: int, rootfs: str, sources: Sources) -> None:
    """Mount the shim's files into the container whose first process is ``pid``.

    ``rootfs`` is the host path of the container's root. Raise HookError when it cannot be done.
    """
    try:
        ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        proc_root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        preload = os.open(sources.preload, os.O_RDWR | os.O_CLOEXEC)
        root_stat = os.stat(rootfs)
    except OSError as exc:
        cause = f"cannot reach the container's process or root ({exc})"
        raise HookError(cause, _FIX_NODE) from None
    try:
        if os.fstat(ns).st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            raise HookError(
                "the container shares the host's mount namespace",
                "give the container its own mount namespace",
            )
        if _identity(root_stat) == _identity(os.stat("/")):
            # Mountpoints would be created in the host's own /etc, /usr and /run.
            raise HookError(
                "the container's root is the host's root directory",
                "give the container a root filesystem of its own",
            )
        _in_child(lambda: _attach_all(ns, proc_root, preload, rootfs, root_stat, sources))
    finally:
        for fd in (ns, proc_root, preload):
            os.close(fd)


def _in_child(work: Callable[[], None]) -> None:
    """Run ``work`` in a forked child; turn its failure report into a HookError."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:
        status = 1
        try:
            os.close(read_end)
            work()
            status = 0
        except inroot.InRootError as exc:
            os.write(write_end, _IMAGE + str(exc).encode(errors="replace"))
        except BaseException as exc:
            os.write(write_end, _NODE + str(exc).encode(errors="replace"))
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as report_src:
        report = report_src.read()
    _, wait_status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(wait_status) != 0 or report:
        cause = report[1:].decode(errors="replace") or "the mount helper process died"
        fix = _FIX_IMAGE if report[:1] == _IMAGE else _FIX_NODE
        raise HookError(f"cannot put the GPU limits in place: {cause}", fix)


def _clone(path: str, attrs: int) -> int:
    fd = syscalls.open_tree(
        syscalls.AT_FDCWD, path, syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC
    )
    syscalls.mount_setattr(fd, attrs)
    return fd


def _attach_all(
    ns: int, proc_root: int, preload: int, rootfs: str, root_stat: os.stat_result, src: Sources
) -> None:
    """The child's work: clone in the host namespace, then join the container's and attach."""
    trees = {
        ACCOUNT_MOUNT: _clone(src.account_dir, _ACCOUNT),
        LIBRARY_PATH: _clone(src.library, _READ_ONLY),
        LIMITS_PATH: _clone(src.limits, _DATA_ONLY),
        PRELOAD_PATH: _clone(src.preload, _DATA_ONLY),
    }
    expected = {path: _identity(os.fstat(fd)) for path, fd in trees.items()}
    syscalls.setns(ns, syscalls.CLONE_NEWNS)
    root = _container_root(proc_root, rootfs, root_stat)

    # The directory first: a file mounted earlier could be hidden under it.
    target = inroot.open_dir(root, ACCOUNT_MOUNT)
    inroot.require(target, ACCOUNT_MOUNT, directory=True)
    if _identity(os.fstat(target)) == _identity(root_stat):
        raise inroot.InRootError(f"{ACCOUNT_MOUNT} leads to the container's root directory")
    syscalls.move_mount(trees[ACCOUNT_MOUNT], target)

    for path in (LIBRARY_PATH, LIMITS_PATH, PRELOAD_PATH):
        target, existed = inroot.open_file(root, path)
        if path == PRELOAD_PATH:
            image = inroot.read_regular(root, path, PRELOAD_LIMIT) if existed else b""
            os.ftruncate(preload, 0)
            os.pwrite(preload, merge_preload(image), 0)
        syscalls.move_mount(trees[path], target)

    # What the container will open at each path must be what was mounted there.
    for path, identity in expected.items():
        if _identity(inroot.stat_path(root, path)) != identity:
            raise inroot.InRootError(f"{path} does not lead to what vcuda mounted there")


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _container_root(proc_root: int, rootfs: str, root_stat: os.stat_result) -> int:
    """Return an fd of the container's root as its mount namespace shows it."""
    want = _identity(root_stat)
    if _identity(os.fstat(proc_root)) == want:
        return proc_root  # the runtime has pivoted already
    # Not pivoted yet: the root is mounted at its host path in the container's namespace.
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    resolve = syscalls.RESOLVE_IN_ROOT | syscalls.RESOLVE_NO_MAGICLINKS
    try:
        fd = syscalls.openat2(proc_root, rootfs.lstrip("/"), flags, resolve)
    except FileNotFoundError:
        fd = -1
    if fd < 0 or _identity(os.fstat(fd)) != want:
        raise RuntimeError(f"{rootfs} is not the container's root in its mount namespace")
    return fd
