"""A tenant that can only create pods (root in its container) does not get out of its limits.

Each case is an attack that once worked, run under real runc with the real hook.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime_hook.contract import Gpu, parse_limits, write_inventory
from tests.hook.bundles import CONTAINERD_CAPABILITIES, HookSetup, Runtime, limits_annotation
from tests.hook.conftest import BuildBundle

GIB = 1 << 30
GPU0 = "GPU-5c3d0a1e-7b2f-4c1d-9e8a-00000000000a"
GPU1 = "GPU-81aa0b2f-1c3d-4e5f-8a9b-00000000000b"


def _inventory(hook: HookSetup) -> None:
    write_inventory(str(hook.inventory), [Gpu(GPU0, 0, 16 * GIB), Gpu(GPU1, 1, 16 * GIB)])


def _hook_line(stderr: str) -> str:
    """The hook's one line, out of runc's report of the failed hook (which escapes its newline)."""
    [line] = [ln[ln.index("vcuda-hook:") :] for ln in stderr.splitlines() if "vcuda-hook:" in ln]
    return line.split("\\n")[0]


def _start(
    runc: Runtime,
    bundle: BuildBundle,
    hook: HookSetup,
    cid: str,
    *,
    cores: int = 30,
    memory: int = GIB,
    args: tuple[str, ...] = ("true",),
    detached: Path | None = None,
    **options: object,
):
    path = bundle(
        list(args),
        annotations=limits_annotation(main=(cores, memory)),
        hooks=hook.hooks(),
        **options,
    )
    if detached is not None:
        return runc.run_detached(path, cid, detached)
    return runc.run(path, cid)


def test_own_gpu_in_capitals_in_the_env_is_still_the_gpu_and_its_memory_still_checked(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    _inventory(hook)
    first = _start(
        runc, bundle, hook, "first", memory=10 * GIB, args=("sleep", "600"),
        gpus=(GPU0,), detached=tmp_path / "first.log",
    )
    assert first.returncode == 0, (tmp_path / "first.log").read_text()
    attack = _start(
        runc, bundle, hook, "attack", memory=8 * GIB,
        gpus=(GPU0,), env=(f"NVIDIA_VISIBLE_DEVICES={GPU0.upper()}",),
    )
    assert attack.returncode != 0
    assert _hook_line(attack.stderr).startswith(
        f"vcuda-hook: container main (attack): GPU {GPU0} (index 0) has 6.00 GiB"
    )
    fits = _start(
        runc, bundle, hook, "fits", args=("cat", "/etc/vcuda/limits"),
        gpus=(GPU0.upper(),), env=(f"NVIDIA_VISIBLE_DEVICES={GPU0.upper()}",),
    )
    assert fits.returncode == 0, fits.stderr
    assert parse_limits(fits.stdout).devices == (GPU0,)  # the inventory's spelling


def test_env_naming_another_gpu_than_the_device_plugin_gave_refuses_the_start(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _inventory(hook)
    result = _start(
        runc, bundle, hook, "other", gpus=(GPU0,), env=(f"NVIDIA_VISIBLE_DEVICES={GPU1}",)
    )
    assert result.returncode != 0
    assert _hook_line(result.stderr) == (
        f"vcuda-hook: container main (other): the container's environment sets "
        f"NVIDIA_VISIBLE_DEVICES={GPU1}, but the device plugin's volume mounts give it {GPU0}; "
        "fix: remove NVIDIA_VISIBLE_DEVICES from the pod's env: the device plugin chooses the GPUs"
    )
    assert not list(hook.state_dir.glob("containers/*"))  # nothing committed


def test_env_alone_without_the_device_plugins_list_gives_no_gpu_and_no_start(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _inventory(hook)
    result = _start(runc, bundle, hook, "envonly", env=(f"NVIDIA_VISIBLE_DEVICES={GPU0}",))
    assert result.returncode != 0
    assert "no trusted list of this container's GPUs" in _hook_line(result.stderr)


def test_gpu_missing_from_the_inventory_does_not_start_unlimited(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _inventory(hook)
    stranger = "GPU-00000000-0000-4000-8000-0000000000ff"
    result = _start(runc, bundle, hook, "stranger", gpus=(stranger,))
    assert result.returncode != 0
    assert f"name {stranger}, which this node's GPU inventory does not list" in _hook_line(
        result.stderr
    )


def test_two_90_core_containers_on_one_gpu_the_second_is_refused(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    _inventory(hook)
    first = _start(
        runc, bundle, hook, "first", cores=90, args=("sleep", "600"),
        gpus=(GPU0,), detached=tmp_path / "first.log",
    )
    assert first.returncode == 0, (tmp_path / "first.log").read_text()
    second = _start(runc, bundle, hook, "second", cores=90, gpus=(GPU0,))
    assert second.returncode != 0
    assert _hook_line(second.stderr) == (
        f"vcuda-hook: container main (second): GPU {GPU0} (index 0) has 10% of its time free "
        "for shared containers, and this container asks for 90%; fix: lower the container's "
        "vcuda-memory or vcuda-core, or start it once other containers on that GPU stop"
    )
    other_gpu = _start(runc, bundle, hook, "other-gpu", cores=90, gpus=(GPU1,))
    assert other_gpu.returncode == 0, other_gpu.stderr


_PINNED = ("/etc/vcuda", "/etc", "/run/vcuda", "/run", "/usr", "/usr/local", "/usr/local/vcuda",
           "/usr/local/vcuda/lib", "/etc/vcuda/limits", "/etc/ld.so.preload",
           "/usr/local/vcuda/lib/libvcuda.so")
# Root in the container tries to move, remove or unmount each path leading to its limits.
_DETACH = f"""
for p in {' '.join(_PINNED)}; do
    mv $p $p.moved 2>/dev/null && echo "MOVED $p"
    rm -f $p 2>/dev/null && echo "REMOVED $p"
    rmdir $p 2>/dev/null && echo "REMOVED $p"
    umount -l $p 2>/dev/null && echo "UNMOUNTED $p"
done
touch /etc/image-file && echo ETC-WRITABLE
cat /etc/vcuda/limits /etc/ld.so.preload
stat -c %s /usr/local/vcuda/lib/libvcuda.so
"""


def test_root_in_the_container_cannot_move_remove_or_unmount_what_leads_to_its_limits(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _inventory(hook)
    result = _start(runc, bundle, hook, "detach", args=("sh", "-c", _DETACH), gpus=(GPU0,))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert not [line for line in lines if line.split()[0] in ("MOVED", "REMOVED", "UNMOUNTED")]
    assert lines[0] == "ETC-WRITABLE"  # /etc stays the image's, writable as it was
    assert parse_limits("\n".join(lines[1:6]) + "\n").devices == (GPU0,)
    assert lines[6] == "/usr/local/vcuda/lib/libvcuda.so"
    assert int(lines[7]) == hook.library.stat().st_size


def test_a_read_only_root_stays_read_only_under_the_pinned_directories(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _inventory(hook)
    script = "touch /etc/x /run/x /usr/x 2>/dev/null && echo WRITABLE; cat /etc/vcuda/limits"
    result = _start(runc, bundle, hook, "ro", args=("sh", "-c", script), gpus=(GPU0,),
                    readonly=True)
    assert result.returncode == 0, result.stderr
    assert "WRITABLE" not in result.stdout
    assert parse_limits(result.stdout).devices == (GPU0,)


def test_a_directory_on_a_volume_is_refused(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, tmp_path: Path
) -> None:
    _inventory(hook)
    volume = tmp_path / "volume"
    volume.mkdir()
    path = bundle(["true"], annotations=limits_annotation(main=(30, GIB)), hooks=hook.hooks(),
                  gpus=(GPU0,))
    config = json.loads((path / "config.json").read_text())
    config["mounts"].append({"destination": "/usr/local", "type": "bind",
                             "source": str(volume), "options": ["rbind", "rw"]})
    (path / "config.json").write_text(json.dumps(config))
    result = runc.run(path, "volume")
    assert result.returncode != 0
    assert "/usr/local is not on the container's root filesystem (a volume?)" in _hook_line(
        result.stderr
    )


# The attack of a user namespace: in a new user and mount namespace the tenant holds every
# capability, mounts an empty file over the preload list and a tmpfs over /etc/vcuda, and
# what it runs there loads no libvcuda.so.
_USERNS_ESCAPE = (
    "touch /tmp/e; unshare -Urm sh -c 'mount --bind /tmp/e /etc/ld.so.preload && "
    "mount -t tmpfs none /etc/vcuda && echo ESCAPED'; cat /etc/ld.so.preload /etc/vcuda/limits"
)


@pytest.mark.parametrize("uid", [0, 1000], ids=["root", "uid 1000"])
def test_the_user_namespace_escape_is_refused_by_the_seccomp_filter_the_hook_requires(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup, uid: int
) -> None:
    _inventory(hook)
    result = _start(runc, bundle, hook, f"userns{uid}", gpus=(GPU0,), uid=uid,
                    capabilities=CONTAINERD_CAPABILITIES, args=("sh", "-c", _USERNS_ESCAPE))
    assert result.returncode == 0, result.stderr
    assert "ESCAPED" not in result.stdout
    preload, limits = result.stdout.split("\n", 1)
    assert preload.endswith("libvcuda.so")
    assert parse_limits(limits).devices == (GPU0,)


def test_a_limited_container_without_a_seccomp_filter_does_not_start(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _inventory(hook)
    result = _start(runc, bundle, hook, "unconfined", gpus=(GPU0,), seccomp=None,
                    capabilities=CONTAINERD_CAPABILITIES, args=("sh", "-c", _USERNS_ESCAPE))
    assert result.returncode != 0
    assert _hook_line(result.stderr) == (
        "vcuda-hook: container main (unconfined): the container is limited, but it runs "
        "without a seccomp filter, so it can create a user namespace and mount over the limits; "
        "fix: give the container seccompProfile RuntimeDefault (vcuda's webhook sets it) and "
        "no CAP_SYS_ADMIN; see the README's threat model"
    )
    assert not list(hook.state_dir.glob("containers/*"))  # nothing committed


def test_a_limited_container_with_cap_sys_admin_does_not_start(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    _inventory(hook)
    result = _start(runc, bundle, hook, "admin", gpus=(GPU0,), capabilities=("CAP_SYS_ADMIN",),
                    args=("umount", "/etc/ld.so.preload"))
    assert result.returncode != 0
    assert "its process holds CAP_SYS_ADMIN, with which it can unmount the limits" in (
        _hook_line(result.stderr))


def test_an_unlimited_container_runs_without_a_seccomp_filter(
    runc: Runtime, bundle: BuildBundle, hook: HookSetup
) -> None:
    path = bundle(["true"], annotations={}, hooks=hook.hooks(), seccomp=None)
    result = runc.run(path, "plain")
    assert result.returncode == 0, result.stderr
