"""Pods on the per-GPU placement paths of the test cluster and what each was given: the
assignment recorded at bind, the node's GPUs and ledger, the OCI spec that containerd ran,
and the GPU memory a CUDA program in the container sees."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from runtime_hook.contract import (
    ASSIGNMENT_ANNOTATION,
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    Gpu,
)
from runtime_hook.device_assignment import DEVICE_LIST_DIR
from runtime_hook.placement import (
    Assignment,
    Entry,
    decode_assignment,
    decode_inventory,
    decode_ledger,
)
from tests.cluster.kube import Cluster
from tests.cluster.vcuda import PROBE, wait_placement_ready

NODE = "vcuda-test-node"
GIB_UNITS = 4  # vcuda-memory units (256 MiB) in a GiB
WHOLE = {"docker.com/vcuda-core": "100"}
_SOCKETS = ("vcuda-io-shared-gpu.sock", "vcuda-io-gpu.sock")  # the agent's, by resource


def share(cores: int, gib: float) -> dict[str, str]:
    """The limits of a shared container: ``cores`` percent and ``gib`` GiB (whole 256 MiB
    units)."""
    return {"docker.com/vcuda-core": str(cores),
            "docker.com/vcuda-memory": str(int(gib * GIB_UNITS))}


def pod(name: str, image: str, limits: dict[str, str]) -> dict:
    """A pod with ``limits`` (its scheduler left to the webhook) whose container logs the GPU
    memory a CUDA program sees, then sleeps. The probe runs as the container's own process:
    NVIDIA's runtime's stand-in gives the driver's environment to the spec it starts, which
    ``kubectl exec`` does not take."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never",
                "command": ["sh", "-c", f"{PROBE} link init ctx 0 info; exec sleep 3600"],
                "resources": {"limits": limits}}]}}


# The API server's words when a review passed the webhook's timeoutSeconds (5 s).
_REVIEW_TIMED_OUT = re.compile(r'failed calling webhook "pods\.vcuda\.io".*deadline exceeded')
_CREATE_ATTEMPTS = 3


def create(cluster: Cluster, *pods: dict) -> None:
    """Create ``pods`` in one request of kubectl's. A pod refused only because its review
    passed the webhook's 5 s is created again, as a controller would, up to 3 times in all:
    on this 2-core machine, dozens of containers starting at once can hold a review that
    long (a burst's admissions take 5-500 ms here; on a shared CI machine one took over 5 s).
    Any other error fails at once, and the retries are printed."""
    waiting = list(pods)
    for attempt in range(1, _CREATE_ATTEMPTS + 1):
        result = cluster.kubectl("create", "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": waiting}))
        if result.returncode == 0:
            return
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
        assert errors and all(_REVIEW_TIMED_OUT.search(line) for line in errors), \
            f"kubectl create: {result.stderr}"
        present = {item["metadata"]["name"]
                   for item in cluster.get("pods", "-n", "default")["items"]}
        waiting = [item for item in waiting if item["metadata"]["name"] not in present]
        print(f"create, attempt {attempt}: {len(errors)} reviews timed out; "
              f"{len(waiting)} pods created again")
    raise AssertionError(f"kubectl create: reviews still time out after {_CREATE_ATTEMPTS} "
                         f"attempts: {result.stderr}")


def delete(cluster: Cluster, *names: str, timeout: float = 120) -> None:
    """Delete pods ``names`` and wait until the node agent pruned their ledger lines (its
    watch of the node's pods does as each goes): until then their GPU room is given out."""
    listed = cluster.get("pods", "-n", "default")["items"]
    uids = {pod["metadata"]["uid"] for pod in listed if pod["metadata"]["name"] in names}
    cluster.ok("delete", "pod", "-n", "default", "--ignore-not-found", "--wait=true",
               *names, timeout=300)
    deadline = time.monotonic() + timeout
    while uids & set(ledger(cluster)):
        assert time.monotonic() < deadline, f"ledger lines of {names} are still there"
        time.sleep(1)


def wait_running(cluster: Cluster, *names: str, timeout: int = 180) -> None:
    for name in names:
        result = cluster.kubectl("wait", f"pod/{name}", "-n", "default", f"--timeout={timeout}s",
                                 "--for=jsonpath={.status.phase}=Running", timeout=timeout + 30)
        assert result.returncode == 0, (f"{name} is not running: "
                                        f"{cluster.events(name, '', timeout=0)}")


def gpus(cluster: Cluster) -> tuple[Gpu, ...]:
    """The node's GPUs as its agent published them, by index."""
    annotations = cluster.get("node", NODE)["metadata"]["annotations"]
    return tuple(sorted(decode_inventory(annotations[INVENTORY_ANNOTATION]).gpus,
                        key=lambda gpu: gpu.index))


def node_events(cluster: Cluster, reason: str) -> list[dict]:
    """The test node's Events of ``reason``, as the API lists them."""
    return cluster.get("events", "-n", "default", "--field-selector",
                       f"involvedObject.kind=Node,involvedObject.name={NODE},"
                       f"reason={reason}")["items"]


def ledger(cluster: Cluster) -> dict[str, Entry]:
    """The node's GPU ledger, by pod uid."""
    annotations = cluster.get("node", NODE)["metadata"]["annotations"]
    return decode_ledger(annotations.get(LEDGER_ANNOTATION))


def assignment(cluster: Cluster, name: str) -> Assignment:
    """What the extender recorded on pod ``name`` at bind."""
    annotations = cluster.get("pod", name, "-n", "default")["metadata"]["annotations"]
    return decode_assignment(annotations[ASSIGNMENT_ANNOTATION])


def spec_gpus(cluster: Cluster, name: str) -> list[str]:
    """The GPUs of the OCI spec that containerd ran for pod ``name``'s container (its bundle's
    config.json, as NVIDIA's runtime left it for runc): its device-list mounts."""
    status = cluster.get("pod", name, "-n", "default")["status"]["containerStatuses"][0]
    container = status["containerID"].split("://", 1)[1]
    bundle = Path(cluster.kubeconfig.parent, "containerd", "state",
                  "io.containerd.runtime.v2.task", "k8s.io", container)
    spec = json.loads((bundle / "config.json").read_text())
    return sorted(mount["destination"][len(DEVICE_LIST_DIR) + 1:] for mount in spec["mounts"]
                  if mount["destination"].startswith(DEVICE_LIST_DIR + "/"))


def cuda_total(cluster: Cluster, name: str) -> int:
    """The total memory a CUDA program in pod ``name``'s container saw (cuMemGetInfo)."""
    out = cluster.ok("logs", "-n", "default", name)
    info = next(line.split() for line in out.splitlines() if line.startswith("info "))
    assert info[1] == "CUDA_SUCCESS", out
    return int(info[3])


def ready(cluster: Cluster, timeout: float = 180) -> None:
    """Until kubelet advertises vcuda's slots of both GPUs and every extender has listed the
    nodes (after a restart of one of them)."""
    wait_placement_ready(cluster.kubectl, NODE, time.monotonic() + timeout)


def plugin_sockets(cluster: Cluster) -> dict[str, int]:
    """When each of vcuda's device-plugin sockets in kubelet's device-plugins folder on the node
    (under the node's overlay) was made, by name (not its inode, which a new one may reuse)."""
    folder = Path(cluster.kubeconfig.parent, "node", "var", "lib", "kubelet", "device-plugins")
    return {name: (folder / name).stat().st_mtime_ns for name in _SOCKETS
            if (folder / name).exists()}


def wait_plugins_served_again(cluster: Cluster, before: dict[str, int],
                              timeout: float = 120) -> None:
    """Until both of vcuda's device plugins serve on sockets made after ``before`` (kubelet
    removes them when it starts; the node agent serves and registers them again)."""
    deadline = time.monotonic() + timeout
    while True:
        now = plugin_sockets(cluster)
        if len(now) == len(_SOCKETS) and all(now[n] != before.get(n) for n in _SOCKETS):
            time.sleep(2)  # the registration follows the serving
            return
        assert time.monotonic() < deadline, f"vcuda's device plugins not served again: {now}"
        time.sleep(1)


def stays_pending(cluster: Cluster, name: str, seconds: float) -> bool:
    """Whether pod ``name`` is still Pending and unbound after ``seconds``."""
    time.sleep(seconds)
    got = cluster.get("pod", name, "-n", "default")
    return got["status"].get("phase") == "Pending" and not got["spec"].get("nodeName")


def assert_waits_for(cluster: Cluster, name: str, reason: str) -> None:
    """Pod ``name`` got ``reason`` (the extender's, as its Events show it) and stays Pending."""
    events = cluster.events(name, reason, timeout=60)
    assert reason in events, events
    assert stays_pending(cluster, name, 5)
