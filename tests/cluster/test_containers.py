"""Limited containers started by the real kubelet and containerd through the ``vcuda`` runtime
class: the hook's files inside, the limit as a CUDA program sees it, and the hook's refusals in
the pod's events."""

from __future__ import annotations

import json

from tests.cluster.kube import Cluster
from tests.cluster.vcuda import PROBE

MEMORY_UNITS = 8  # vcuda-memory: 8 units of 256 MiB
SHARE = {"docker.com/vcuda-core": "50", "docker.com/vcuda-memory": str(MEMORY_UNITS)}


def _pod(name: str, image: str, command: str, env: dict[str, str] | None = None) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": "default"},
                       "spec": {"restartPolicy": "Never", "containers": [{
                           "name": "main", "image": image, "imagePullPolicy": "Never",
                           "command": ["sh", "-c", command],
                           "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                           "resources": {"limits": SHARE}}]}})


def test_a_limited_container_has_its_limits_and_a_cuda_program_sees_them(
        vcuda: Cluster) -> None:
    command = ("test -s /etc/vcuda/limits && echo limits-file; cat /etc/ld.so.preload; "
               f"{PROBE} link init ctx 0 info")
    vcuda.ok("apply", "-f", "-", stdin=_pod("limited", vcuda.vcuda_image(), command))
    try:
        vcuda.ok("wait", "pod/limited", "--for=jsonpath={.status.phase}=Succeeded",
                 "--timeout=120s")
        logs = vcuda.ok("logs", "limited")
        assert logs.startswith("limits-file\n"), logs
        assert "/usr/local/vcuda/lib/libvcuda.so" in logs  # /etc/ld.so.preload
        info = [line for line in logs.splitlines() if line.startswith("info ")]
        assert info and info[0].split()[1:2] == ["CUDA_SUCCESS"], logs
        assert int(info[0].split()[3]) == MEMORY_UNITS * 256 << 20  # total: the limit
    finally:
        vcuda.ok("delete", "pod", "limited", "--wait=true")


def test_a_pod_that_sets_nvidia_visible_devices_itself_is_refused_with_the_hooks_line(
        vcuda: Cluster) -> None:
    vcuda.ok("apply", "-f", "-", stdin=_pod("chooses-gpus", vcuda.vcuda_image(), "true",
                                            env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    try:
        fix = "remove NVIDIA_VISIBLE_DEVICES from the pod's env: the device plugin chooses"
        events = vcuda.events("chooses-gpus", fix)
        assert fix in events, events
        assert vcuda.get("pod", "chooses-gpus")["status"]["phase"] != "Succeeded"
    finally:
        vcuda.ok("delete", "pod", "chooses-gpus", "--wait=true")
