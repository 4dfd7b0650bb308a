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

Each directory on the way to those paths (``/etc``, ``/etc/vcuda``, ``/run``,
``/usr`` ... ``/usr/local/vcuda/lib``) is first made a mount point of itself
(:data:`PINNED`), so root in the container cannot rename or remove any of
them (EBUSY) without unmounting, which takes CAP_SYS_ADMIN; and none may be
or pass through a symbolic link, or lie on a volume.

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


def _parents(paths: tuple[str, ...]) -> tuple[str, ...]:
    found = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent != "/":
            found.add(parent)
            parent = os.path.dirname(parent)
    return tuple(sorted(found, key=lambda p: (p.count("/"), p)))


# Every directory on the way to what is mounted, outermost first: each is made a
# mount point, so that none can be renamed or removed from inside the container.
PINNED = _parents((LIBRARY_PATH, LIMITS_PATH, PRELOAD_PATH, ACCOUNT_MOUNT))

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


def install(pid: int, rootfs: str, sources: Sources, readonly: bool = False) -> None:
    """Mount the shim's files into the container whose first process is ``pid``.

    ``rootfs`` is the host path of the container's root; ``readonly`` whether
    the runtime makes it read-only. Raise HookError when it cannot be done.
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
        _in_child(
            lambda: _attach_all(ns, proc_root, preload, rootfs, root_stat, sources, readonly)
        )
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


def _make_file(root: int, path: str) -> bool:
    """Create ``path`` where it is missing; return whether the image had it."""
    fd, existed = inroot.open_file(root, path)
    os.close(fd)
    return existed


def _mount_id(fdinfo: int, fd: int) -> int:
    """The id of the mount ``fd`` lies on, from /proc/self/fdinfo (``fdinfo``: its dir fd)."""
    info = os.open(str(fd), os.O_RDONLY | os.O_CLOEXEC, dir_fd=fdinfo)
    try:
        text = os.read(info, 4096)
    finally:
        os.close(info)
    for line in text.splitlines():
        if line.startswith(b"mnt_id:"):
            return int(line.split()[1])
    raise RuntimeError("no mnt_id in /proc/self/fdinfo (Linux 3.15 or later needed)")


def _check_on_root_mount(root: int, fdinfo: int) -> None:
    """Refuse when a directory to pin lies on a mount other than the root's (a volume).

    A volume is shared with the pod's other containers, in whose mount
    namespaces the pins are no mount points: from there, what they hold
    could be renamed or removed.
    """
    want = _mount_id(fdinfo, root)
    for directory in PINNED:
        fd = inroot.open_dir(root, directory)
        try:
            inroot.require(fd, directory, directory=True)
            if _mount_id(fdinfo, fd) != want:
                raise inroot.InRootError(
                    f"{directory} is not on the container's root filesystem (a volume?)"
                )
        finally:
            os.close(fd)


def _pin(root: int, directory: str, readonly: bool) -> None:
    """Make ``directory`` a mount point of itself (with what is mounted below it).

    A mount point cannot be renamed or removed (EBUSY) but by unmounting it,
    which takes CAP_SYS_ADMIN: so no one in the container can move a path
    that leads to vcuda's files.
    """
    fd = inroot.open_dir(root, directory)
    try:
        flags = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_RECURSIVE
        clone = syscalls.open_tree(fd, "", flags | syscalls.AT_EMPTY_PATH)
        try:
            if readonly:  # the runtime remounts only the root read-only, after the hooks
                syscalls.mount_setattr(clone, syscalls.MOUNT_ATTR_RDONLY)
            syscalls.move_mount(clone, fd)
        finally:
            os.close(clone)
    finally:
        os.close(fd)


def _attach_all(
    ns: int,
    proc_root: int,
    preload: int,
    rootfs: str,
    root_stat: os.stat_result,
    src: Sources,
    readonly: bool,
) -> None:
    """The child's work: clone in the host namespace, then join the container's and attach."""
    trees = {
        ACCOUNT_MOUNT: _clone(src.account_dir, _ACCOUNT),
        LIBRARY_PATH: _clone(src.library, _READ_ONLY),
        LIMITS_PATH: _clone(src.limits, _DATA_ONLY),
        PRELOAD_PATH: _clone(src.preload, _DATA_ONLY),
    }
    expected = {path: _identity(os.fstat(fd)) for path, fd in trees.items()}
    # This process's fdinfo, opened while /proc is the host's.
    fdinfo = os.open("/proc/self/fdinfo", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    syscalls.setns(ns, syscalls.CLONE_NEWNS)
    root = _container_root(proc_root, rootfs, root_stat)

    # Every mountpoint is made first: pinned directories may be read-only.
    os.close(inroot.open_dir(root, ACCOUNT_MOUNT))
    existed = {path: _make_file(root, path) for path in (LIBRARY_PATH, LIMITS_PATH, PRELOAD_PATH)}
    _check_on_root_mount(root, fdinfo)
    for directory in PINNED:
        _pin(root, directory, readonly)

    # Looked up again: what was opened before a pin lies under it. The directory
    # first: a file mounted earlier could be hidden under it.
    target = inroot.open_dir(root, ACCOUNT_MOUNT)
    inroot.require(target, ACCOUNT_MOUNT, directory=True)
    syscalls.move_mount(trees[ACCOUNT_MOUNT], target)

    for path in (LIBRARY_PATH, LIMITS_PATH, PRELOAD_PATH):
        target, _ = inroot.open_file(root, path)
        if path == PRELOAD_PATH:
            image = inroot.read_regular(root, path, PRELOAD_LIMIT) if existed[path] else b""
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
