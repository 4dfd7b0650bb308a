"""The system calls the hook makes through _ctypes: results, errors, and the structs they pass."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from runtime_hook import syscalls

_PROC_MAGIC = 0x9FA0
_TMPFS_MAGIC = 0x01021994
_IN_ROOT = syscalls.RESOLVE_IN_ROOT | syscalls.RESOLVE_NO_MAGICLINKS


def _inode(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    os.close(fd)
    return st.st_dev, st.st_ino


def test_openat2_keeps_dot_dot_and_absolute_links_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "root" / "etc").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "out").symlink_to("/")
    root = os.open(tmp_path / "root", os.O_PATH | os.O_DIRECTORY)
    try:
        flags = os.O_PATH | os.O_DIRECTORY
        expected = _inode(os.open(tmp_path / "root", os.O_PATH))
        assert _inode(syscalls.openat2(root, "../..", flags, _IN_ROOT)) == expected
        assert _inode(syscalls.openat2(root, "etc/out", flags, _IN_ROOT)) == expected
    finally:
        os.close(root)


def test_openat2_refuses_proc_magic_links() -> None:
    with pytest.raises(OSError) as caught:
        syscalls.openat2(
            syscalls.AT_FDCWD, "/proc/self/exe", os.O_PATH, syscalls.RESOLVE_NO_MAGICLINKS
        )
    assert caught.value.errno == errno.ELOOP


def test_a_failed_call_raises_oserror_with_its_errno_name_and_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError) as caught:
        syscalls.openat2(syscalls.AT_FDCWD, missing, os.O_RDONLY, 0)
    assert caught.value.filename == missing
    assert str(caught.value).startswith("[Errno 2] openat2: No such file or directory")
    with pytest.raises(OSError) as bad_fd:
        syscalls.setns(-1, syscalls.CLONE_NEWNS)
    assert bad_fd.value.errno == errno.EBADF


def test_fs_type_reads_the_filesystem_magic() -> None:
    fd = os.open("/proc", os.O_PATH)
    try:
        assert syscalls.fs_type(fd) == _PROC_MAGIC
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_tmpfs_mounted_with_its_options_and_unmounted(tmp_path: Path) -> None:
    target = tmp_path / "mnt"
    target.mkdir()
    flags = syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC
    syscalls.mount("tmpfs", str(target), "tmpfs", flags, "size=1m,mode=1777")
    try:
        assert os.path.ismount(target)
        assert oct(target.stat().st_mode & 0o7777) == oct(0o1777)
        fd = os.open(target, os.O_PATH)
        assert syscalls.fs_type(fd) == _TMPFS_MAGIC
        os.close(fd)
    finally:
        syscalls.umount2(str(target), syscalls.MNT_DETACH | syscalls.UMOUNT_NOFOLLOW)
    assert not os.path.ismount(target)
    with pytest.raises(OSError) as caught:
        syscalls.umount2(str(target), 0)
    assert caught.value.errno == errno.EINVAL


@pytest.mark.skipif(os.geteuid() != 0, reason="cloning mounts needs root")
def test_cloned_file_is_made_read_only_and_attached(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    source.write_text("limits\n")
    target.touch()
    clone = syscalls.open_tree(
        syscalls.AT_FDCWD, str(source), syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC
    )
    syscalls.mount_setattr(clone, syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOEXEC)
    on = os.open(target, os.O_PATH | os.O_CLOEXEC)
    try:
        syscalls.move_mount(clone, on)
        assert target.read_text() == "limits\n"
        with pytest.raises(OSError) as caught:
            target.write_text("raised\n")
        assert caught.value.errno == errno.EROFS
    finally:
        os.close(on)
        os.close(clone)
        syscalls.umount2(str(target), syscalls.MNT_DETACH)
    assert target.read_text() == ""
