"""The runtime class ``vcuda`` end to end: containerd, driven over CRI as kubelet drives it, on a
node set up by ``vcuda-node install``, starts pods whose limits reach their containers.

The GPU inventory is made up (two 8 GiB GPUs), as no GPU is needed: the
hook only reads which GPUs NVIDIA's device plugin gave the container (its
volume-mounts device list), which the test passes as kubelet passes a device
plugin's allocation: as container mounts and environment.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from runtime_hook.contract import ACCOUNT_PATH, Limits, render_limits
from runtime_hook.device_assignment import device_plugin_spec
from tests.cri.client import Pod
from tests.cri.node import LIBRARY, ContainerdNode
from tests.cri.pods import GIB, GPUS, SLEEP, placed_pod, read, refused
from tests.hook.bundles import limits_annotation

PRELOAD = "/usr/local/vcuda/lib/libvcuda.so\n"


def _limited_pod(node: ContainerdNode, name: str, **limits: tuple[int, int]) -> Pod:
    return node.cri.run_pod(name, limits_annotation(**limits))


def _on_gpu(index: int) -> dict[str, dict[str, str]]:
    """The options of a container that NVIDIA's device plugin gave GPU ``index``."""
    env, mounts = device_plugin_spec([GPUS[index].uuid])
    return {"env": dict(e.split("=", 1) for e in env),
            "mounts": {m["destination"]: m["source"] for m in mounts}}


def _hooked(node: ContainerdNode, container: str) -> bool:
    """Whether anything of vcuda is in the container: limits, preload line or library."""
    paths = ("/etc/vcuda/limits", "/etc/ld.so.preload", "/usr/local/vcuda/lib/libvcuda.so")
    return any(read(node, container, path) is not None for path in paths)


def _wait_for_ledger(node: ContainerdNode, expected: list[str], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while node.ledger() != sorted(expected) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node.ledger() == sorted(expected)


def test_a_limited_container_sees_the_library_its_read_only_limits_and_the_preload_line(
    node: ContainerdNode,
) -> None:
    pod = _limited_pod(node, "train", worker=(30, 2 * GIB))
    worker = node.cri.run(pod, "worker", SLEEP, **_on_gpu(1))
    assert read(node, worker, "/etc/vcuda/limits") == render_limits(
        Limits(memory=2 * GIB, cores=30, devices=(GPUS[1].uuid,), account=ACCOUNT_PATH))
    assert read(node, worker, "/etc/ld.so.preload") == PRELOAD
    library = node.cri.exec(worker, "cat", "/usr/local/vcuda/lib/libvcuda.so")
    assert library.stdout == LIBRARY.read_bytes()
    assert node.ledger() == [worker]


@pytest.mark.parametrize("attempt", [
    "echo cores=100 > /etc/vcuda/limits",
    "echo > /etc/ld.so.preload",
    "rm /etc/vcuda/limits",
    "mv /etc/ld.so.preload /tmp/preload",
    "umount /etc/vcuda/limits",
    "umount /etc/ld.so.preload",
    "mount -o remount,rw /etc/vcuda/limits",
    "echo x > /usr/local/vcuda/lib/libvcuda.so",
])
def test_a_limited_container_cannot_change_its_limits_or_the_preload_line(
    node: ContainerdNode, attempt: str
) -> None:
    pod = _limited_pod(node, "train", worker=(30, 2 * GIB))
    worker = node.cri.run(pod, "worker", SLEEP, **_on_gpu(0))
    limits = read(node, worker, "/etc/vcuda/limits")
    answer = node.cri.exec(worker, "sh", "-c", attempt)
    assert answer.exit_code != 0, answer.stdout
    assert re.search(rb"(?i)read-only file system|not permitted|resource busy|permission denied",
                     answer.stderr), answer.stderr
    assert read(node, worker, "/etc/vcuda/limits") == limits
    assert read(node, worker, "/etc/ld.so.preload") == PRELOAD


def test_a_second_container_of_the_pod_without_an_entry_is_untouched(node: ContainerdNode) -> None:
    pod = _limited_pod(node, "train", worker=(30, 2 * GIB))
    worker = node.cri.run(pod, "worker", SLEEP, **_on_gpu(0))
    sidecar = node.cri.run(pod, "sidecar", SLEEP, **_on_gpu(0))
    assert not _hooked(node, sidecar)
    assert _hooked(node, worker)
    assert node.ledger() == [worker]


def test_the_pod_sandbox_container_is_not_hooked(node: ContainerdNode) -> None:
    pod = _limited_pod(node, "train", worker=(30, 2 * GIB))
    node.cri.run(pod, "worker", SLEEP, **_on_gpu(0))
    pause = node.cri.sandbox_pid(pod)
    mounts = Path(f"/proc/{pause}/mountinfo").read_text()
    assert not {"/etc/vcuda", "/etc/ld.so.preload", "/run/vcuda"} & {
        line.split()[4] for line in mounts.splitlines()}
    assert pod.id not in node.ledger()


def test_a_pod_without_runtime_handler_vcuda_is_untouched_whatever_its_annotations(
    node: ContainerdNode,
) -> None:
    pod = node.cri.run_pod("plain", limits_annotation(worker=(30, 2 * GIB)), handler="")
    worker = node.cri.run(pod, "worker", SLEEP, **_on_gpu(0))
    assert not _hooked(node, worker)
    assert node.ledger() == []


def test_stopping_a_container_releases_its_memory_and_removing_it_keeps_the_ledger_right(
    node: ContainerdNode,
) -> None:
    pod = _limited_pod(node, "train", worker=(30, 6 * GIB))
    worker = node.cri.run(pod, "worker", SLEEP, **_on_gpu(0))
    assert node.ledger() == [worker]
    node.cri.stop(worker)
    _wait_for_ledger(node, [])  # poststop ran when containerd deleted the stopped task
    node.cri.remove(worker)
    assert node.ledger() == []
    # What was released can be given out again: 6 GiB of the 8 fits once more.
    again = node.cri.run(_limited_pod(node, "next", worker=(30, 6 * GIB)), "worker", SLEEP,
                         **_on_gpu(0))
    assert node.ledger() == [again]


def test_removing_a_pod_releases_the_memory_of_its_running_containers(node: ContainerdNode) -> None:
    pod = _limited_pod(node, "train", a=(30, 2 * GIB), b=(20, 1 * GIB))
    started = [node.cri.run(pod, name, SLEEP, **_on_gpu(0)) for name in ("a", "b")]
    assert node.ledger() == sorted(started)
    node.cri.remove_pod(pod)
    assert node.ledger() == []


def test_a_container_restarted_in_the_same_sandbox_gets_its_limits_again(
    node: ContainerdNode,
) -> None:
    pod = _limited_pod(node, "train", worker=(30, 2 * GIB))
    show = ["sh", "-c", "cat /etc/vcuda/limits /etc/ld.so.preload; exit 3"]
    first = node.cri.run(pod, "worker", show, **_on_gpu(0))
    assert node.cri.wait_exited(first).exit_code == 3
    _wait_for_ledger(node, [])
    # kubelet restarts it: the next attempt, a new container in the same sandbox.
    second = node.cri.run(pod, "worker", show, **_on_gpu(0), attempt=1)
    assert node.cri.wait_exited(second).exit_code == 3
    expected = render_limits(Limits(memory=2 * GIB, cores=30, devices=(GPUS[0].uuid,),
                             account=ACCOUNT_PATH)) + PRELOAD
    assert node.cri.output(pod, "worker", 0) == expected
    assert node.cri.output(pod, "worker", 1) == expected


def test_overcommit_of_a_gpu_is_refused_with_the_hooks_message_in_the_cri_error(
    node: ContainerdNode,
) -> None:
    first = node.cri.run(_limited_pod(node, "big", worker=(50, 6 * GIB)), "worker", SLEEP,
                         **_on_gpu(0))
    late, line = refused(node, _limited_pod(node, "late", worker=(30, 4 * GIB)), **_on_gpu(0))
    assert line.startswith(f"vcuda-hook: container default/late/worker ({late[:12]}): GPU "
                           f"{GPUS[0].uuid} (index 0) has 2.00 GiB"), line
    assert "this container asks for 4.00 GiB" in line, line
    assert node.ledger() == [first]
    # The other GPU has room: the same request placed there starts.
    other = node.cri.run(_limited_pod(node, "moved", worker=(30, 4 * GIB)), "worker", SLEEP,
                         **_on_gpu(1))
    assert node.ledger() == sorted([first, other])


def test_a_pod_that_names_another_gpu_in_its_env_is_refused(node: ContainerdNode) -> None:
    pod = _limited_pod(node, "forged", worker=(30, 2 * GIB))
    options = _on_gpu(0)
    # kubelet passes the pod's env after the device plugin's; containerd keeps the last.
    options["env"] = {**options["env"], "NVIDIA_VISIBLE_DEVICES": GPUS[1].uuid}
    _, line = refused(node, pod, **options)
    assert node.ledger() == []
    assert f"sets NVIDIA_VISIBLE_DEVICES={GPUS[1].uuid}, but the device plugin's volume mounts " \
        f"give it {GPUS[0].uuid}; fix: remove NVIDIA_VISIBLE_DEVICES from the pod's env" in line


def test_a_limited_container_the_device_plugin_gave_no_gpu_is_refused(
    node: ContainerdNode,
) -> None:
    _, line = refused(node, _limited_pod(node, "bare", worker=(30, 2 * GIB)))
    assert node.ledger() == []
    assert "no trusted list of this container's GPUs (" in line, line
    assert "fix: run NVIDIA's device plugin with deviceListStrategy volume-mounts" in line, line


def test_the_gpu_chosen_at_bind_reaches_the_container_through_containerd(
    node: ContainerdNode,
) -> None:
    worker = node.cri.run(placed_pod(node, "placed", 1), "worker", SLEEP)
    assert read(node, worker, "/etc/vcuda/limits") == render_limits(
        Limits(memory=2 * GIB, cores=30, devices=(GPUS[1].uuid,), account=ACCOUNT_PATH))
    assert node.ledger() == [worker]


def test_a_placement_the_device_plugin_contradicts_is_refused(node: ContainerdNode) -> None:
    _, line = refused(node, placed_pod(node, "split", 1), **_on_gpu(0))
    assert node.ledger() == []
    assert GPUS[0].uuid in line and GPUS[1].uuid in line and "; fix: " in line, line


def test_containerd_restarted_while_a_limited_container_runs_leaves_the_ledger_right(
    node: ContainerdNode,
) -> None:
    pod = _limited_pod(node, "train", worker=(30, 2 * GIB), gone=(30, 2 * GIB))
    worker = node.cri.run(pod, "worker", SLEEP, **_on_gpu(0))
    gone = node.cri.run(pod, "gone", SLEEP, **_on_gpu(0))
    gone_pid = node.cri.pid(gone)
    node.stop_containerd()
    assert node.ledger() == sorted([worker, gone])  # containerd's stop is not the containers'
    os.kill(gone_pid, signal.SIGKILL)  # it dies while containerd is down
    node.start_containerd()
    _wait_for_ledger(node, [worker])
    assert read(node, worker, "/etc/vcuda/limits") is not None
    node.cri.stop(worker)
    _wait_for_ledger(node, [])


def test_containerds_default_profile_stops_the_user_namespace_escape(node: ContainerdNode) -> None:
    pod = _limited_pod(node, "train", worker=(30, 2 * GIB))
    worker = node.cri.run(pod, "worker", SLEEP, **_on_gpu(0))  # RuntimeDefault, as kubelet asks
    answer = node.cri.exec(worker, "sh", "-c", "touch /tmp/e; unshare -Urm sh -c "
                           "'mount --bind /tmp/e /etc/ld.so.preload && echo ESCAPED'")
    assert answer.exit_code != 0
    assert b"ESCAPED" not in answer.stdout
    assert b"Operation not permitted" in answer.stderr, answer.stderr
    assert read(node, worker, "/etc/ld.so.preload") == PRELOAD


def test_an_unconfined_limited_container_is_refused_by_the_hook(node: ContainerdNode) -> None:
    container, line = refused(node, _limited_pod(node, "open", worker=(30, 2 * GIB)),
                              seccomp=False, **_on_gpu(0))
    assert line == (
        f"vcuda-hook: container default/open/worker ({container[:12]}): the container is "
        "limited, but it runs without a seccomp filter, so it can create a user namespace and "
        "mount over the limits; fix: give the container seccompProfile RuntimeDefault (vcuda's "
        "webhook sets it) and no CAP_SYS_ADMIN; see the README's threat model")
    assert node.ledger() == []
