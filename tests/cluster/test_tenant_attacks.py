"""A tenant's attacks through the real API: a namespace user with the ``edit`` role in a
namespace that Pod Security holds to ``baseline``."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.cluster.kube import Cluster
from tests.cri.images import BUSYBOX_IMAGE

TENANT = "vcuda-tenant"
SHARE = {"docker.com/vcuda-core": "50", "docker.com/vcuda-memory": "8"}


class Tenant:
    """kubectl as the tenant's service account (token only, no admin certificate)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.token = cluster.ok("create", "token", "tenant", "-n", TENANT).strip()

    def kubectl(self, *args: str,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cluster.as_token(self.token, "-n", TENANT, *args, stdin=stdin)


@pytest.fixture(scope="module")
def tenant(vcuda: Cluster) -> Iterator[Tenant]:
    vcuda.ok("create", "namespace", TENANT)
    try:
        vcuda.ok("label", "namespace", TENANT, "pod-security.kubernetes.io/enforce=baseline")
        vcuda.ok("create", "serviceaccount", "tenant", "-n", TENANT)
        vcuda.ok("create", "rolebinding", "tenant-edit", "-n", TENANT, "--clusterrole=edit",
                 f"--serviceaccount={TENANT}:tenant")
        # Polled: kubectl wait --for=create is 1.31's, and the suite runs on 1.30 too.
        deadline = time.monotonic() + 60
        while vcuda.kubectl("get", "-n", TENANT, "serviceaccount/default").returncode != 0:
            assert time.monotonic() < deadline, f"no default ServiceAccount in {TENANT}"
            time.sleep(0.5)
        yield Tenant(vcuda)
    finally:
        vcuda.ok("delete", "namespace", TENANT, "--wait=true", timeout=300)


def _pod(name: str, command: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"restartPolicy": "Never", "containers": [{
                           "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                           "command": ["sh", "-c", command],
                           "resources": {"limits": SHARE}}]}})


def test_a_tenant_cannot_change_the_limits_of_its_running_pod(tenant: Tenant) -> None:
    created = tenant.kubectl("apply", "-f", "-", stdin=_pod("victim", "sleep 3600"))
    assert created.returncode == 0, created.stderr
    waited = tenant.kubectl("wait", "pod/victim", "--for=condition=Ready", "--timeout=120s")
    assert waited.returncode == 0, waited.stderr
    for key in ("vcuda.io/limits", "vcuda.io/assigned-gpus"):
        patch = json.dumps({"metadata": {"annotations": {key: '{"main":{"cores":100}}'}}})
        result = tenant.kubectl("patch", "pod", "victim", "-p", patch)
        assert result.returncode != 0, key
        assert "denied the request" in result.stderr and key in result.stderr, result.stderr


def test_a_pod_without_security_context_cannot_make_a_user_namespace(tenant: Tenant) -> None:
    """RuntimeDefault (set by the webhook, checked by the hook) refuses unshare(CLONE_NEWUSER),
    by which a process would get capabilities to unmount the limits."""
    command = ("unshare -Urm true 2>/dev/null && echo unshared || echo refused; "
               "test -s /etc/vcuda/limits && echo limited")
    created = tenant.kubectl("apply", "-f", "-", stdin=_pod("escaper", command))
    assert created.returncode == 0, created.stderr
    waited = tenant.kubectl("wait", "pod/escaper", "--for=jsonpath={.status.phase}=Succeeded",
                            "--timeout=120s")
    assert waited.returncode == 0, waited.stderr
    assert tenant.kubectl("logs", "escaper").stdout == "refused\nlimited\n"


def test_a_debug_container_gets_no_gpu_and_cannot_change_the_limits_of_its_target(
        tenant: Tenant) -> None:
    """``kubectl debug --target``: an ephemeral container in the limited container's process
    namespace. The ``edit`` role may not add one (pods/ephemeralcontainers); one that a
    namespace admin adds is not seen by the webhook and has no entry in the limits, so the
    device plugin gave it no GPU and the hook leaves it alone, and the limited container's
    files stay read-only even through ``/proc/1/root``."""
    created = tenant.kubectl("apply", "-f", "-", stdin=_pod("debugged", "sleep 3600"))
    assert created.returncode == 0, created.stderr
    waited = tenant.kubectl("wait", "pod/debugged", "--for=condition=Ready", "--timeout=120s")
    assert waited.returncode == 0, waited.stderr
    before = tenant.kubectl("exec", "debugged", "-c", "main", "--", "cat", "/etc/vcuda/limits")
    command = ("ls /var/run/nvidia-container-devices >/dev/null 2>&1 && echo has-gpu; "
               "{ echo cores=100 > /proc/1/root/etc/vcuda/limits; } 2>/dev/null && echo wrote; "
               "{ echo > /proc/1/root/etc/ld.so.preload; } 2>/dev/null && echo emptied; "
               "head -n 1 /proc/1/root/etc/vcuda/limits")
    debug = ("debug", "debugged", f"--image={BUSYBOX_IMAGE}", "--image-pull-policy=Never",
             "--profile=baseline", "--target=main", "-c", "dbg", "--", "sh", "-c", command)
    assert tenant.kubectl(*debug).returncode != 0  # edit does not cover ephemeral containers
    assert "ephemeralContainers" not in tenant.cluster.get("pod", "debugged", "-n", TENANT)[
        "spec"]
    tenant.cluster.ok("-n", TENANT, *debug)  # as the namespace's admin
    tenant.cluster.ok(
        "wait", "-n", TENANT, "pod/debugged", "--timeout=120s",
        "--for=jsonpath={.status.ephemeralContainerStatuses[0].state.terminated.reason}"
        "=Completed")
    assert tenant.kubectl("logs", "debugged", "-c", "dbg").stdout == "version=1\n"
    after = tenant.kubectl("exec", "debugged", "-c", "main", "--", "cat", "/etc/vcuda/limits")
    assert (after.returncode, after.stdout) == (0, before.stdout)


def test_whole_gpus_of_vcudas_own_plugin_asked_for_directly_never_run(tenant: Tenant) -> None:
    """``vcuda.io/gpu`` is per-GPU placement's resource; on this path no node has it, so the
    scheduler keeps the pod Pending and says why."""
    pod = json.loads(_pod("direct-whole", "true"))
    pod["spec"]["containers"][0]["resources"] = {"limits": {"vcuda.io/gpu": "1"}}
    created = tenant.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    assert created.returncode == 0, created.stderr
    waited = tenant.kubectl(
        "wait", "pod/direct-whole", "--timeout=120s",
        "--for=jsonpath={.status.conditions[?(@.type=='PodScheduled')].reason}=Unschedulable")
    assert waited.returncode == 0, waited.stderr
    events = tenant.kubectl("get", "events", "--field-selector",
                            "involvedObject.name=direct-whole", "-o", "json")
    messages = [e["message"] for e in json.loads(events.stdout)["items"]]
    assert any("Insufficient vcuda.io/gpu" in m for m in messages), messages
