"""Fixtures of the hook's tests: hook set-up on the host, bundles, runtimes, a canary tree."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.hook.bundles import REPO, HookSetup, Runtime, make_rootfs, runc_spec, write_bundle

BuildBundle = Callable[..., Path]


def _skip_without(binary: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("container runtimes need root")
    if not shutil.which(binary):
        pytest.skip(f"{binary} is not installed (scripts/setup installs it)")


@pytest.fixture
def hook(tmp_path: Path) -> HookSetup:
    """A state dir, a library file and a (not yet written) inventory path for the hook."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    built = REPO / "cshim" / "build" / "libvcuda.so"
    library = tmp_path / "node" / "libvcuda.so"
    library.parent.mkdir()
    if built.exists():
        shutil.copy2(built, library)
    else:  # the hook only bind-mounts the library: any file proves that
        library.write_bytes(b"stand-in for libvcuda.so\n")
    return HookSetup(
        state_dir=state,
        library=library,
        inventory=tmp_path / "gpus.json",
        log_file=tmp_path / "hook.log",
    )


@pytest.fixture(scope="session")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not shutil.which("runc"):
        pytest.skip("runc is not installed (scripts/setup installs it)")
    return runc_spec(tmp_path_factory.mktemp("spec"))


@pytest.fixture
def bundle(tmp_path: Path, spec: dict) -> BuildBundle:
    """Build a bundle with a fresh busybox root; ``prepare(rootfs)`` may edit the root first."""
    count = 0

    def build(args: list[str], prepare: Callable[[Path], None] | None = None, **kw: object) -> Path:
        nonlocal count
        count += 1
        path = tmp_path / f"bundle{count}"
        rootfs = make_rootfs(path / "rootfs")
        if prepare:
            prepare(rootfs)
        return write_bundle(path, spec, args, **kw)  # type: ignore[arg-type]

    return build


def _cleanup(runtime: Runtime) -> None:
    listed = runtime.call("list", "-q").stdout.split()
    for cid in listed:
        runtime.call("delete", "-f", cid)


@pytest.fixture
def runc(tmp_path: Path) -> Iterator[Runtime]:
    _skip_without("runc")
    runtime = Runtime("runc", tmp_path / "runc-root")
    yield runtime
    _cleanup(runtime)


def _hybrid_cgroups() -> bool:
    with open("/proc/self/mountinfo") as src:
        return any(line.split()[4] == "/sys/fs/cgroup/unified" for line in src)


@pytest.fixture(params=["runc", "crun"])
def runtime(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runtime]:
    """Each of runc and crun (crun refuses hybrid cgroups: it gets a namespace without v2)."""
    name = request.param
    _skip_without(name)
    wrapper: tuple[str, ...] = ()
    if name == "crun" and _hybrid_cgroups():
        script = 'umount /sys/fs/cgroup/unified && exec "$0" "$@"'
        wrapper = ("unshare", "--mount", "sh", "-c", script)
    runtime = Runtime(name, tmp_path / f"{name}-root", wrapper)
    yield runtime
    _cleanup(runtime)


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A host tree shaped like the paths the hook writes; hostile images point at it."""
    root = tmp_path / "canary"
    for sub in ("etc/vcuda", "run/vcuda", "usr/local/vcuda/lib"):
        (root / sub).mkdir(parents=True)
    (root / "etc" / "ld.so.preload").write_text("/canary/preload.so\n")
    (root / "etc" / "passwd").write_text("root:x:0:0:canary:/root:/bin/sh\n")
    (root / "etc" / "vcuda" / "limits").write_text("memory=1\n")
    return root
