"""The hook under real runc and crun: limits land inside, and no image makes it write outside."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime_hook.contract import Gpu, Limits, parse_limits, write_inventory
from runtime_hook.hook_errors import HookError
from runtime_hook.inject import Sources, install
from tests.hook.bundles import (
    HOOK_ENV,
    HookSetup,
    Runtime,
    limits_annotation,
    mounts_under,
    snapshot,
    write_bundle,
)
from tests.hook.conftest import BuildBundle

GIB = 1 << 30
LIBRARY = "/usr/local/vcuda/lib/libvcuda.so"
# Prints the three files, tries to write each, then uses the account directory.
PROBE = f"""
cat /etc/ld.so.preload; echo ---
cat /etc/vcuda/limits; echo ---
sha256sum {LIBRARY}; echo ---
for f in /etc/vcuda/limits /etc/ld.so.preload {LIBRARY}; do
    echo x >> $f && echo "WROTE $f"
done
echo 1 > /run/vcuda/account && echo "ACCOUNT WRITABLE"
stat -c %a /run/vcuda
"""
LIMITED = limits_annotation(main=(30, 2 * GIB))


def _limited(
    bundle: BuildBundle,
    hook: HookSetup,
    script: str = PROBE,
    env: tuple[str, ...] = (),
    hooks: dict | None = None,
    **options: object,
) -> Path:
    """A container limited to 30% and 2 GiB of GPU-1111 that runs ``script``."""
    return bundle(
        ["sh", "-c", script],
        annotations=LIMITED,
        gpus=("GPU-1111",),
        env=env,
        hooks=hooks or hook.hooks(),
        **options,
    )


def _no_records_left(hook: HookSetup) -> None:
    assert list((hook.state_dir / "containers").iterdir()) == []
    assert mounts_under(hook.state_dir) == []


def _assert_limits_inside(stdout: str, hook: HookSetup, image_preload: str = "") -> str:
    """Check the probe's output; return what it printed after the three files."""
    preload, limits, digest, rest = stdout.split("---\n")
    assert preload == f"{LIBRARY}\n{image_preload}"
    assert parse_limits(limits) == Limits(
        memory=2 * GIB, cores=30, devices=("GPU-1111",), account="/run/vcuda/account"
    )
    assert digest.split()[0] == hashlib.sha256(hook.library.read_bytes()).hexdigest()
    assert "WROTE" not in rest
    return rest


def test_limited_container_reads_its_limits_and_cannot_write_them(
    runtime: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    def image_with_preload(root: Path) -> None:
        (root / "etc" / "ld.so.preload").write_text("/lib/image-own.so\n")

    path = _limited(bundle, hook, prepare=image_with_preload)
    result = runtime.run(path, "limited")
    assert result.returncode == 0, result.stderr
    rest = _assert_limits_inside(result.stdout, hook, image_preload="/lib/image-own.so\n")
    assert rest.split()[-2:] == ["WRITABLE", "1777"]
    assert (path / "rootfs" / "etc" / "ld.so.preload").read_text() == "/lib/image-own.so\n"
    _no_records_left(hook)  # poststop released it


def test_non_root_user_can_create_the_account_but_not_touch_the_limits(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    path = _limited(bundle, hook, uid=1000)
    result = runc.run(path, "nonroot")
    assert result.returncode == 0, result.stderr
    rest = _assert_limits_inside(result.stdout, hook)
    assert "ACCOUNT WRITABLE" in rest


def _symlink(path: str, target: str | Callable[[Path], str]) -> Callable[[Path, Path], None]:
    def prepare(root: Path, canary: Path) -> None:
        link = root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_dir() and not link.is_symlink():
            link.rmdir()  # make_rootfs made it
        link.symlink_to(target(canary) if callable(target) else target)

    return prepare


def _make(path: str, kind: str) -> Callable[[Path, Path], None]:
    def prepare(root: Path, canary: Path) -> None:
        node = root / path.lstrip("/")
        node.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(node)
        elif kind == "dir":
            node.mkdir()
        elif kind == "chardev":
            os.mknod(node, 0o600 | 0o020000, os.makedev(1, 3))
        elif kind == "huge":
            node.write_text("/lib/x.so\n" * 8000)
        else:
            node.write_text("a file\n")

    return prepare


_LINK = "is or passes through a symbolic link"
# (image change, the refusal the start must fail with)
HOSTILE = {
    "etc is an absolute symlink to a host dir": (
        _symlink("/etc", lambda c: str(c / "etc")),
        f"/etc {_LINK}",
    ),
    "ld.so.preload is a symlink to a host file": (
        _symlink("/etc/ld.so.preload", lambda c: str(c / "etc" / "ld.so.preload")),
        f"/etc/ld.so.preload {_LINK}",
    ),
    "ld.so.preload climbs out with ..": (
        _symlink("/etc/ld.so.preload", lambda c: "../" * 30 + str(c / "etc/ld.so.preload")),
        f"/etc/ld.so.preload {_LINK}",
    ),
    "etc/vcuda is a symlink to a host dir": (
        _symlink("/etc/vcuda", lambda c: str(c / "etc" / "vcuda")),
        f"/etc/vcuda {_LINK}",
    ),
    "run/vcuda is a symlink to a host dir": (
        _symlink("/run/vcuda", lambda c: str(c / "run" / "vcuda")),
        f"/run/vcuda {_LINK}",
    ),
    "usr/local/vcuda dangles": (
        _symlink("/usr/local/vcuda", "/nowhere/at/all"),
        f"/usr/local/vcuda {_LINK}",
    ),
    "ld.so.preload is a magic link through /proc": (
        _symlink("/etc/ld.so.preload", "/proc/1/root/etc/passwd"),
        f"/etc/ld.so.preload {_LINK}",
    ),
    "ld.so.preload is a symlink loop": (
        _symlink("/etc/ld.so.preload", "/etc/ld.so.preload"),
        f"/etc/ld.so.preload {_LINK}",
    ),
    "ld.so.preload is a FIFO": (
        _make("/etc/ld.so.preload", "fifo"),
        "/etc/ld.so.preload is a FIFO, expected a regular file",
    ),
    "ld.so.preload is a device": (
        _make("/etc/ld.so.preload", "chardev"),
        "/etc/ld.so.preload is a character device, expected a regular file",
    ),
    "limits is a directory": (
        _make("/etc/vcuda/limits", "dir"),
        "/etc/vcuda/limits is a directory, expected a regular file",
    ),
    "etc/vcuda is a file": (_make("/etc/vcuda", "file"), "/etc/vcuda is not a directory"),
    "ld.so.preload is huge": (_make("/etc/ld.so.preload", "huge"), "is larger than 65536 bytes"),
    "usr/local leads into sysfs": (_symlink("/usr/local", "/sys/kernel"), f"/usr/local {_LINK}"),
    "run/vcuda leads to the root": (_symlink("/run/vcuda", "/"), f"/run/vcuda {_LINK}"),
    # Even a link that stays inside: it may lead into a volume the pod shares.
    "etc is a symlink into a volume": (_symlink("/etc", "/data/etc"), f"/etc {_LINK}"),
    "run/vcuda leads to /etc": (_symlink("/run/vcuda", "/etc"), f"/run/vcuda {_LINK}"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_image_does_not_start_and_the_host_stays_intact(
    case: str, runc: Runtime, bundle: BuildBundle, hook: HookSetup, canary: Path
) -> None:
    prepare, refusal = HOSTILE[case]
    path = _limited(bundle, hook, prepare=lambda root: prepare(root, canary))
    before = snapshot(canary)
    result = runc.run(path, "hostile")
    assert result.returncode != 0
    assert "vcuda-hook: container main (hostile): " in result.stderr
    assert refusal in result.stderr
    assert result.stdout == ""  # the container's command never ran
    assert snapshot(canary) == before
    assert mounts_under(canary) == []
    _no_records_left(hook)


def test_hostile_image_is_refused_the_same_way_under_runc_and_crun(
    runtime: Runtime, bundle: BuildBundle, hook: HookSetup, canary: Path
) -> None:
    prepare, refusal = HOSTILE["ld.so.preload is a symlink to a host file"]
    path = _limited(bundle, hook, script="true", prepare=lambda root: prepare(root, canary))
    before = snapshot(canary)
    result = runtime.run(path, "hostile")
    assert result.returncode != 0
    # crun (1.8) reports only the hook's exit code; the cause is in the hook's log.
    shown = result.stderr if runtime.name == "runc" else hook.log_file.read_text()
    assert f"container main (hostile): cannot put the GPU limits in place: {refusal}" in shown
    assert snapshot(canary) == before
    _no_records_left(hook)


def test_read_only_root_still_gets_limits_and_stays_read_only(
    runtime: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    script = PROBE + "touch /new-file && echo ROOT WRITABLE || echo ROOT READ-ONLY\n"
    path = _limited(bundle, hook, script=script, readonly=True)
    result = runtime.run(path, "readonly")
    assert result.returncode == 0, result.stderr
    rest = _assert_limits_inside(result.stdout, hook)
    assert rest.split()[-1] == "READ-ONLY"


def _bind_read_only(root: Path) -> None:
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], check=True)


def test_root_on_a_read_only_filesystem_needs_the_mountpoints_in_the_image(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    def plugin_mountpoint(root: Path) -> None:  # runc makes none on a read-only filesystem
        (root / "var/run/nvidia-container-devices").mkdir(parents=True)
        (root / "var/run/nvidia-container-devices/GPU-1111").touch()

    def ship_mountpoints(root: Path) -> None:
        plugin_mountpoint(root)
        for path in ("etc/vcuda/limits", "etc/ld.so.preload", LIBRARY.lstrip("/")):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).touch()
        (root / "run" / "vcuda").mkdir(parents=True)

    bare = _limited(bundle, hook, prepare=plugin_mountpoint)
    shipped = _limited(bundle, hook, prepare=ship_mountpoints)
    for path in (bare, shipped):
        _bind_read_only(path / "rootfs")
    try:
        refused = runc.run(bare, "bare")
        started = runc.run(shipped, "shipped")
    finally:
        for path in (bare, shipped):
            subprocess.run(["umount", str(path / "rootfs")], check=True)
    assert refused.returncode != 0
    assert "is missing and the container's root filesystem is read-only" in refused.stderr
    assert started.returncode == 0, started.stderr
    _assert_limits_inside(started.stdout, hook)
    _no_records_left(hook)


def test_hostile_environment_does_not_reach_the_hook(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    marker = tmp_path / "hijacked"
    evil = tmp_path / "evil"
    evil.mkdir()
    # Modules the hook loads that some Python builds find on the path (not built in or frozen).
    for module in ("fcntl", "errno", "_ctypes", "_json", "sitecustomize"):
        (evil / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (evil / "evil.so").write_text("not a library\n")
    poison = (
        f"LD_PRELOAD={evil / 'evil.so'}",
        f"PYTHONPATH={evil}",
        f"PYTHONSTARTUP={evil / 'fcntl.py'}",
        "PYTHONHOME=/nonexistent",
        "PYTHONINSPECT=1",
    )
    # In the image's environment, and even in the hook entry's own (only -I protects it there).
    path = _limited(
        bundle, hook, env=poison, hooks=hook.hooks(env=("PATH=/usr/bin:/bin", *poison[1:]))
    )
    result = runc.run(path, "poisoned")
    assert result.returncode == 0, result.stderr
    _assert_limits_inside(result.stdout, hook)
    assert not marker.exists()


# What the hook's start-up cost comments promise: a limited start loads none of these (json
# and re cost ~8 ms, dataclasses 9, collections 2; fast_json, Record and _ctypes stand in).
AVOIDED_MODULES = frozenset({"json", "re", "collections", "ctypes", "dataclasses", "typing"})


def test_a_limited_start_loads_none_of_the_modules_the_hook_avoids(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    write_inventory(str(hook.inventory), [Gpu(uuid="GPU-1111", index=0, memory=16 * GIB)])
    trace = tmp_path / "importtime"
    traced = {
        stage: [{
            "path": "/bin/sh",
            "args": ["sh", "-c", f'exec "$@" 2>>{trace}', "sh",
                     *hook.args(stage, python_flags=("-I", "-S", "-X", "importtime"))],
            "env": list(HOOK_ENV),
            "timeout": 20,
        }]
        for stage in ("prestart", "poststop")
    }  # fmt: skip
    result = runc.run(_limited(bundle, hook, hooks=traced), "traced")
    assert result.returncode == 0, result.stderr
    _assert_limits_inside(result.stdout, hook)
    loaded = {line.split("|")[-1].strip() for line in trace.read_text().splitlines()}
    # The listing covers the whole limited path: the decision, the ledger, the mounts.
    assert {"runtime_hook.contract", "runtime_hook.ledger", "runtime_hook.inject"} <= loaded
    assert loaded & AVOIDED_MODULES == set()


def test_container_whose_root_is_the_host_root_is_refused(hook: HookSetup, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a process its own mount namespace")
    stand_in = subprocess.Popen(["unshare", "--mount", "sleep", "60"])
    try:
        for _ in range(100):  # wait until it is in its own mount namespace
            if (
                os.stat(f"/proc/{stand_in.pid}/ns/mnt").st_ino
                != os.stat("/proc/self/ns/mnt").st_ino
            ):
                break
            time.sleep(0.01)
        (tmp_path / "preload").touch()
        sources = Sources(
            library=str(hook.library),
            limits=str(hook.library),
            preload=str(tmp_path / "preload"),
            account_dir=str(tmp_path),
        )
        with pytest.raises(HookError, match="the container's root is the host's root"):
            install(stand_in.pid, "/", sources)
    finally:
        stand_in.kill()
        stand_in.wait()


LISTING = "ls -a /; ls -la /etc /run /usr 2>&1; awk '{print $5, $6}' /proc/self/mountinfo"


def test_container_without_annotations_starts_exactly_as_without_the_hook(
    runc: Runtime, bundle: BuildBundle, spec: dict, hook: HookSetup
) -> None:
    path = bundle(["sh", "-c", LISTING])
    assert runc.run(path, "warm-up").returncode == 0  # whatever runc itself creates, it has now
    root_before = snapshot(path / "rootfs")
    without = runc.run(path, "plain")
    write_bundle(path, spec, ["sh", "-c", LISTING], hooks=hook.hooks())
    with_hook = runc.run(path, "hooked")
    assert without.returncode == with_hook.returncode == 0, with_hook.stderr
    assert with_hook.stdout == without.stdout
    assert snapshot(path / "rootfs") == root_before
    assert list(hook.state_dir.iterdir()) == []  # not even the ledger was opened
    assert not hook.log_file.exists()


def test_a_log_that_cannot_be_written_never_fails_a_container(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    full = dataclasses.replace(hook, log_file=Path("/dev/full"))  # every write: ENOSPC
    path = _limited(bundle, full, hooks=full.hooks())
    result = runc.run(path, "log-full")
    assert result.returncode == 0, result.stderr
    _assert_limits_inside(result.stdout, hook)
    _no_records_left(hook)


def test_container_of_a_limited_pod_without_its_own_entry_is_left_alone(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    path = bundle(
        ["sh", "-c", "ls -a / /etc"],
        annotations=limits_annotation(other=(30, GIB)),
        hooks=hook.hooks(),
    )
    root_before = snapshot(path / "rootfs")
    result = runc.run(path, "sidecar")
    assert result.returncode == 0, result.stderr
    assert "vcuda" not in result.stdout
    assert snapshot(path / "rootfs") == root_before
    assert not (hook.state_dir / "containers").exists()


def _wait_stopped(runtime: Runtime, cid: str) -> None:
    for _ in range(200):
        state = runtime.call("state", cid)
        if json.loads(state.stdout or "{}").get("status") == "stopped":
            return
        time.sleep(0.05)
    raise AssertionError(f"{cid} did not stop")


def _gpu_bundles(bundle: BuildBundle, hook: HookSetup, tmp_path: Path) -> tuple[Path, Path]:
    write_inventory(str(hook.inventory), [Gpu(uuid="GPU-1111", index=0, memory=16 * GIB)])
    first = bundle(
        ["sleep", "600"],
        annotations=limits_annotation(main=(50, 10 * GIB)),
        gpus=("0",),  # an index: mapped through the inventory
        hooks=hook.hooks(),
    )
    second = bundle(
        ["true"],
        annotations=limits_annotation(main=(50, 8 * GIB)),
        gpus=("GPU-1111",),
        hooks=hook.hooks(),
    )
    return first, second


def test_with_cores_scaling_shares_pass_100_percent_and_max_sharers_refuses_one_more(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    write_inventory(str(hook.inventory), [Gpu(uuid="GPU-1111", index=0, memory=16 * GIB)])
    node = dataclasses.replace(hook, flags=("--cores-scaling", "1.2", "--max-sharers", "2"))
    for name, cores in (("first", 60), ("second", 50)):  # 110% of the GPU's time
        built = bundle(["sleep", "600"], annotations=limits_annotation(main=(cores, GIB)),
                       gpus=("GPU-1111",), hooks=node.hooks())
        assert runc.run_detached(built, name, tmp_path / f"{name}.log").returncode == 0
    third = bundle(["true"], annotations=limits_annotation(main=(1, GIB)), gpus=("GPU-1111",),
                   hooks=node.hooks())
    refused = runc.run(third, "third")
    assert refused.returncode != 0
    assert (
        "vcuda-hook: container main (third): GPU GPU-1111 (index 0) has 2 shared containers, "
        "the most this node allows on one GPU (--max-sharers 2)"
    ) in refused.stderr
    for name in ("first", "second"):
        runc.call("kill", name, "KILL")
        _wait_stopped(runc, name)
        assert runc.call("delete", name).returncode == 0


def test_overcommitting_a_gpu_fails_until_the_first_container_is_deleted(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    first, second = _gpu_bundles(bundle, hook, tmp_path)
    assert runc.run_detached(first, "first", tmp_path / "first.log").returncode == 0
    refused = runc.run(second, "second")
    assert refused.returncode != 0
    assert (
        "vcuda-hook: container main (second): GPU GPU-1111 (index 0) has 6.00 GiB "
        "(6442450944 bytes) free of 16.00 GiB (17179869184 bytes) for shared containers, "
        "and this container asks for 8.00 GiB (8589934592 bytes)"
    ) in refused.stderr
    runc.call("kill", "first", "KILL")
    _wait_stopped(runc, "first")
    assert runc.call("delete", "first").returncode == 0  # runs poststop
    assert not (hook.state_dir / "containers" / "first").exists()
    started = runc.run(second, "second-again")
    assert started.returncode == 0, started.stderr


def test_memory_of_a_container_that_died_without_poststop_is_reclaimed(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    first, second = _gpu_bundles(bundle, hook, tmp_path)
    assert runc.run_detached(first, "first", tmp_path / "first.log").returncode == 0
    runc.call("kill", "first", "KILL")
    _wait_stopped(runc, "first")  # stopped but not deleted: its poststop has not run
    assert (hook.state_dir / "containers" / "first").exists()
    started = runc.run(second, "second")
    assert started.returncode == 0, started.stderr
    assert not (hook.state_dir / "containers" / "first").exists()
    assert "released containers that are gone: first" in hook.log_file.read_text()


def _two_gpus(hook: HookSetup) -> None:
    write_inventory(str(hook.inventory), [Gpu(uuid="GPU-1111", index=0, memory=16 * GIB),
                                          Gpu(uuid="GPU-2222", index=1, memory=16 * GIB)])


def _multi(bundle: BuildBundle, hook: HookSetup, gpus: tuple[str, ...], args: list[str]) -> Path:
    table = {"main": {"cores": 40, "memory": 4 * GIB, "gpus": 2}}
    return bundle(args, annotations={"vcuda.io/limits": json.dumps(table)}, gpus=gpus,
                  hooks=hook.hooks())


def test_shares_of_two_gpus_list_both_in_one_limits_file(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _two_gpus(hook)
    result = runc.run(_multi(bundle, hook, ("GPU-1111", "1"), ["cat", "/etc/vcuda/limits"]),
                      "multi")
    assert result.returncode == 0, result.stderr
    assert parse_limits(result.stdout) == Limits(
        memory=4 * GIB, cores=40, devices=("GPU-1111", "GPU-2222"), account="/run/vcuda/account")


def test_two_replicas_of_one_gpu_are_refused_for_a_two_gpu_share(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _two_gpus(hook)
    refused = runc.run(_multi(bundle, hook, ("GPU-1111", "0"), ["true"]), "replicas")
    assert refused.returncode != 0
    assert ("the container asks for shares of 2 distinct GPUs, but the device side gave it 1 "
            "(GPU-1111)") in refused.stderr
    assert "time-slicing replicas may be copies of one GPU" in refused.stderr
    assert not (hook.state_dir / "containers").exists()  # refused before anything is committed


def test_a_two_gpu_share_is_committed_on_both_or_on_neither(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    _two_gpus(hook)
    first = bundle(["sleep", "600"], annotations=limits_annotation(main=(50, 14 * GIB)),
                   gpus=("GPU-2222",), hooks=hook.hooks())
    assert runc.run_detached(first, "first", tmp_path / "first.log").returncode == 0
    refused = runc.run(_multi(bundle, hook, ("GPU-1111", "GPU-2222"), ["true"]), "multi")
    assert refused.returncode != 0
    assert "GPU GPU-2222 (index 1) has 2.00 GiB" in refused.stderr
    assert [p.name for p in (hook.state_dir / "containers").iterdir()] == ["first"]
    runc.call("kill", "first", "KILL")
    _wait_stopped(runc, "first")
    assert runc.call("delete", "first").returncode == 0
    started = runc.run(_multi(bundle, hook, ("GPU-1111", "GPU-2222"), ["true"]), "multi-again")
    assert started.returncode == 0, started.stderr


def _virtual(bundle: BuildBundle, hook: HookSetup, entry: dict) -> Path:
    write_inventory(str(hook.inventory), [Gpu(uuid="GPU-1111", index=0, memory=16 * GIB)])
    return bundle(["cat", "/etc/vcuda/limits"],
                  annotations={"vcuda.io/limits": json.dumps({"main": entry})},
                  gpus=("GPU-1111",), hooks=hook.hooks())


@pytest.mark.parametrize(("scaling", "in_host"), [("2", 6 * GIB), ("1.5", 4 * GIB), ("1", 0)])
def test_a_container_asking_virtual_memory_gets_the_part_past_the_scaled_share_in_host_memory(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, scaling: str, in_host: int
) -> None:
    node = dataclasses.replace(hook, flags=("--memory-scaling", scaling))
    built = _virtual(bundle, node, {"cores": 30, "memory": 12 * GIB, "virtual": True})
    result = runc.run(built, "virtual")
    assert result.returncode == 0, result.stderr
    assert parse_limits(result.stdout).virtual_memory == in_host
    log = hook.log_file.read_text()
    if in_host:
        assert f"of which in host memory at most {in_host} " in log
    else:
        assert ("the pod asks for virtual memory, but this node does not scale memory "
                "(--memory-scaling 1): all of its limit is device memory") in log


def test_a_container_not_asking_virtual_memory_keeps_its_limit_on_the_device(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    node = dataclasses.replace(hook, flags=("--memory-scaling", "2"))
    result = runc.run(_virtual(bundle, node, {"cores": 30, "memory": 12 * GIB}), "plain")
    assert result.returncode == 0, result.stderr
    assert parse_limits(result.stdout).virtual_memory == 0


def test_a_virtual_flag_that_is_not_a_boolean_is_refused(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    built = _virtual(bundle, hook, {"cores": 30, "memory": GIB, "virtual": "yes"})
    refused = runc.run(built, "bad")
    assert refused.returncode != 0
    assert "annotation vcuda.io/limits: virtual of 'main' is 'yes', expected true or false" \
        in refused.stderr
