"""In-root file work on a plain directory tree: what is created where, and what is refused."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_hook import inroot
from tests.hook.bundles import snapshot


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root").mkdir()
    return tmp_path / "root"


@pytest.fixture
def root_fd(root: Path) -> Iterator[int]:
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A tree beside the root that hostile links point at."""
    (tmp_path / "outside" / "etc").mkdir(parents=True)
    (tmp_path / "outside" / "etc" / "ld.so.preload").write_text("host\n")
    return tmp_path / "outside"


def _same(fd: int, path: Path) -> bool:
    st = os.fstat(fd)
    os.close(fd)
    return (st.st_dev, st.st_ino) == (os.stat(path).st_dev, os.stat(path).st_ino)


def test_missing_directories_and_file_are_created_inside_the_root(root: Path, root_fd: int) -> None:
    fd, existed = inroot.open_file(root_fd, "/usr/local/vcuda/lib/libvcuda.so")
    created = root / "usr/local/vcuda/lib/libvcuda.so"
    assert not existed and _same(fd, created)
    assert stat.S_IMODE(created.stat().st_mode) & 0o644 == 0o644 and created.stat().st_size == 0
    assert stat.S_IMODE((root / "usr/local/vcuda").stat().st_mode) & 0o755 == 0o755


def test_existing_file_is_used_as_it_is(root: Path, root_fd: int) -> None:
    (root / "etc").mkdir()
    (root / "etc" / "ld.so.preload").write_text("/lib/a.so\n")
    fd, existed = inroot.open_file(root_fd, "/etc/ld.so.preload")
    assert existed and _same(fd, root / "etc" / "ld.so.preload")
    assert inroot.read_regular(root_fd, "/etc/ld.so.preload", 100) == b"/lib/a.so\n"


@pytest.mark.parametrize(
    ("link", "target", "path", "refused"),
    [
        ("etc", "/data/etc", "/etc/vcuda/limits", "/etc"),  # stays inside: into a volume?
        ("etc/vcuda", "../data/v", "/etc/vcuda/limits", "/etc/vcuda"),
        ("etc", "{outside}/etc", "/etc/ld.so.preload", "/etc"),
        (
            "etc/ld.so.preload",
            "../../../../../../../../{outside}/etc/ld.so.preload",
            "/etc/ld.so.preload",
            "/etc/ld.so.preload",
        ),
        ("etc/vcuda", "/nowhere", "/etc/vcuda/limits", "/etc/vcuda"),
        ("etc/ld.so.preload", "ld.so.preload", "/etc/ld.so.preload", "/etc/ld.so.preload"),
    ],
    ids=["inside the root", "relative inside", "absolute out", "dot-dot out", "dangling", "loop"],
)
def test_every_symbolic_link_on_the_path_is_refused_and_nothing_outside_changes(
    root: Path, root_fd: int, outside: Path, link: str, target: str, path: str, refused: str
) -> None:
    (root / "etc").mkdir()
    (root / "data" / "etc" / "vcuda").mkdir(parents=True)
    (root / "data" / "v").mkdir()
    if link == "etc":
        (root / "etc").rmdir()
    (root / link).symlink_to(target.format(outside=outside))
    before, root_before = snapshot(outside), snapshot(root)
    with pytest.raises(inroot.InRootError, match=f"^{refused} is or passes through a symbolic"):
        inroot.open_file(root_fd, path)
    assert snapshot(outside) == before
    assert snapshot(root) == root_before


def test_missing_directories_are_created_where_no_link_is(root: Path, root_fd: int) -> None:
    dir_fd = inroot.open_dir(root_fd, "/run/vcuda")
    assert _same(dir_fd, root / "run" / "vcuda")


@pytest.mark.parametrize(
    ("make", "path", "message"),
    [
        (lambda p: os.mkfifo(p), "/etc/x", "/etc/x is a FIFO, expected a regular file"),
        (lambda p: p.mkdir(), "/etc/x", "/etc/x is a directory, expected a regular file"),
        (lambda p: p.write_text(""), "/etc/x/limits", "/etc/x is not a directory"),
    ],
    ids=["fifo", "directory for a file", "file for a directory"],
)
def test_wrong_kinds_of_file_are_refused(root: Path, root_fd: int, make, path: str, message: str):
    (root / "etc").mkdir()
    make(root / "etc" / "x")
    with pytest.raises(inroot.InRootError, match=message):
        inroot.open_file(root_fd, path)


def test_file_where_a_directory_is_required_is_refused(root: Path, root_fd: int) -> None:
    (root / "run").mkdir()
    (root / "run" / "vcuda").write_text("")
    fd = inroot.open_dir(root_fd, "/run")
    with pytest.raises(inroot.InRootError, match="/run/vcuda is not a directory"):
        inroot.open_dir(root_fd, "/run/vcuda")
    inroot.require(fd, "/run", directory=True)  # the parent itself is fine
    os.close(fd)


def test_oversized_file_is_not_read(root: Path, root_fd: int) -> None:
    (root / "big").write_bytes(b"x" * 101)
    with pytest.raises(inroot.InRootError, match="/big is larger than 100 bytes"):
        inroot.read_regular(root_fd, "/big", 100)
