"""Changing files on the host so that each is, at every moment, wholly old or wholly new.

Every change is built beside its target under a fixed temporary name
(``.<name>.vcuda-new``), flushed to disk, and renamed over the target: a
rename is atomic, so a runtime reading the file, or a crash at any point,
never meets half of one. A temporary left by a crash is replaced by the
next run. A directory tree is built whole under a temporary name and
renamed once complete; a symlink is swapped the same way.
"""

from __future__ import annotations

import os
import shutil
import stat

TEMP_SUFFIX = ".vcuda-new"


def temp_path(path: str) -> str:
    """Where a new version of ``path`` is built."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}{TEMP_SUFFIX}")


def make_dirs(path: str) -> list[str]:
    """Create ``path`` and missing parents (0755); return those created, outermost first."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in reversed(missing):
        os.mkdir(directory, 0o755)
        os.chmod(directory, 0o755)  # whatever the umask
    return list(reversed(missing))


def read_bytes(path: str) -> bytes | None:
    """The content of the regular file ``path``, or None when there is none."""
    try:
        with open(path, "rb") as src:
            return src.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def write_file(path: str, data: bytes, mode: int = 0o644) -> bool:
    """Make ``path`` a regular file holding ``data`` with ``mode``; return whether it changed."""
    try:
        st = os.lstat(path)
        same_file = stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode
        if same_file and read_bytes(path) == data:
            return False
    except FileNotFoundError:
        pass
    temp = temp_path(path)
    _write_temp(temp, data, mode)
    os.replace(temp, path)
    _sync_dir(os.path.dirname(path))
    return True


def write_link(path: str, target: str) -> bool:
    """Make ``path`` a symlink to ``target``; return whether it changed."""
    try:
        if os.readlink(path) == target:
            return False
    except (FileNotFoundError, OSError):
        pass
    if os.path.isdir(path) and not os.path.islink(path):
        raise IsADirectoryError(f"{path} is a directory, not vcuda's link: move it away first")
    temp = temp_path(path)
    remove(temp)
    os.symlink(target, temp)
    os.replace(temp, path)
    _sync_dir(os.path.dirname(path))
    return True


def write_tree(path: str, files: dict[str, bytes], mode: int = 0o644) -> bool:
    """Make ``path`` a directory holding exactly ``files`` (relative path -> content).

    A complete ``path`` is kept (return False), with the ``__pycache__`` Python
    wrote there; anything else there is replaced by a tree built whole beside
    it and renamed in.
    """
    if _tree_holds(path, files):
        return False
    temp = temp_path(path)
    remove(temp)
    os.mkdir(temp, 0o755)
    for name, data in sorted(files.items()):
        target = os.path.join(temp, name)
        for directory in make_dirs(os.path.dirname(target)):
            _sync_dir(os.path.dirname(directory))
        _write_temp(target, data, mode)
    for directory, _, _ in os.walk(temp):
        _sync_dir(directory)
    remove(path)
    os.rename(temp, path)
    _sync_dir(os.path.dirname(path))
    return True


def remove(path: str) -> bool:
    """Remove the file, link or tree at ``path`` if there is one; return whether there was."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return True


def _tree_holds(path: str, files: dict[str, bytes]) -> bool:
    if not os.path.isdir(path) or os.path.islink(path):
        return False
    present = set()
    for directory, subdirs, names in os.walk(path):
        if "__pycache__" in subdirs:
            subdirs.remove("__pycache__")
        present |= {os.path.relpath(os.path.join(directory, name), path) for name in names}
    return present == set(files) and all(
        read_bytes(os.path.join(path, name)) == data for name, data in files.items()
    )


def _write_temp(path: str, data: bytes, mode: int) -> None:
    remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)  # whatever the umask
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
