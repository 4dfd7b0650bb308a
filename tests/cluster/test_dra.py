"""vcuda's DRA driver on the real cluster (``scripts/cluster up --with-vcuda dra``): the node
agent publishes its ResourceSlice to the real apiserver, the cluster's own kube-scheduler
allocates the claims of manifests/dra/examples by consumable capacity, and the real kubelet
has the agent prepare and unprepare them; containerd applies the claim's CDI spec and NVIDIA's
(its stand-in). The node has two GPUs, of 16 GiB (index 0) and 8 GiB (index 1)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_hook.contract import Limits, Sharing, parse_limits
from runtime_hook.node.dra.cdi import spec_path
from runtime_hook.node.dra.slices import GpuModel, devices, slice_name
from tests.cluster import placement as p
from tests.cluster.kube import Cluster
from tests.cluster.vcuda import GPUS_MIB, NAMESPACE, PROBE, REPO, gpu_uuid

EXAMPLES = REPO / "manifests" / "dra" / "examples"
GIB = 1 << 30
# A claim of the tests' own beside the examples': 20 % and 2 GiB, which either GPU holds.
SMALL_TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                  "metadata": {"name": "vcuda-20-2gi", "namespace": "default"},
                  "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                      "deviceClassName": "gpu.vcuda.io",
                      "capacity": {"requests": {"cores": "20", "memory": "2Gi"}}}}]}}}}


def _gpu(index: int) -> str:
    """The slice's device name of GPU ``index``."""
    return devices([GpuModel(gpu_uuid(index), index, GIB, "", (9, 0))], Sharing())[0]["name"]


def _pod(name: str, template: str) -> dict:
    """A pod whose container uses a claim from ``template``: it prints its limits file (if
    any), the GPU memory a CUDA program sees, then sleeps."""
    command = (f"cat /etc/vcuda/limits 2>/dev/null; {PROBE} link init ctx 0 info; "
               "exec sleep 3600")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "main", "image": "", "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", command],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def _create(cluster: Cluster, *pods: dict) -> None:
    image = cluster.vcuda_image()
    for pod in pods:
        pod["spec"]["containers"][0]["image"] = image
    p.create(cluster, *pods)


def _delete(cluster: Cluster, *names: str) -> None:
    cluster.ok("delete", "pod", "-n", "default", "--ignore-not-found", "--wait=true", *names,
               timeout=300)


def _claim(cluster: Cluster, pod: str) -> dict:
    """The ResourceClaim made for pod ``pod`` from its template."""
    status = cluster.get("pod", pod, "-n", "default")["status"]
    name = status["resourceClaimStatuses"][0]["resourceClaimName"]
    return cluster.get("resourceclaim", name, "-n", "default")


def _allocated(claim: dict) -> tuple[str, dict[str, str]]:
    """The device of the claim's one allocation result and the capacity it consumes."""
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1 and results[0]["driver"] == "vcuda.io", results
    return results[0]["device"], results[0].get("consumedCapacity", {})


def _limits(cluster: Cluster, pod: str) -> Limits:
    """The limits file in pod ``pod``'s container, read now."""
    return parse_limits(cluster.ok("exec", "-n", "default", pod, "--", "cat",
                                   "/etc/vcuda/limits"))


def _node(cluster: Cluster) -> Path:
    """The node's files written since it started (its overlays' upper layers)."""
    return cluster.kubeconfig.parent / "node"


def _claim_files(cluster: Cluster, uid: str) -> list[Path]:
    """What the agent keeps of a prepared claim on the node: its CDI spec and its record."""
    return [Path(spec_path(str(_node(cluster) / "run" / "cdi"), uid)),
            _node(cluster) / "run" / "vcuda" / "containers" / f"claim-{uid}"]


def _agent_events(cluster: Cluster, name: str) -> list[dict]:
    """The agent's log lines of event ``name`` (none while kubelet, which serves them, is
    away)."""
    logs = cluster.kubectl("logs", "-n", NAMESPACE, "daemonset/vcuda-node", "-c", "agent")
    lines = (json.loads(line) for line in logs.stdout.splitlines() if line.startswith("{"))
    return [line for line in lines if line.get("event") == name]


def _reasons(cluster: Cluster, pod: str) -> list[str]:
    """The reasons of pod ``pod``'s events."""
    return cluster.ok("get", "events", "-n", "default", "--field-selector",
                      f"involvedObject.name={pod}", "-o",
                      "jsonpath={range .items[*]}{.reason}{'\\n'}{end}").split()


def _until(check: object, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(1)


@pytest.fixture(scope="module")
def templates(dra: Cluster) -> Iterator[Cluster]:
    """The examples' claim templates and the tests' own, in namespace default."""
    dra.ok("apply", "-n", "default", "-f", str(EXAMPLES / "claim-templates.yaml"))
    dra.ok("apply", "-f", "-", stdin=json.dumps(SMALL_TEMPLATE))
    yield dra
    dra.ok("delete", "-n", "default", "-f", str(EXAMPLES / "claim-templates.yaml"))
    dra.ok("delete", "resourceclaimtemplate", "-n", "default", "vcuda-20-2gi")


def test_the_agents_resourceslice_is_accepted_by_the_apiserver_as_written(dra: Cluster) -> None:
    """Read back from the real apiserver: one device per GPU, each with the attributes,
    capacities and request policies the agent writes, shared by many claims."""
    got = dra.get("resourceslice", slice_name(p.NODE))
    models = [GpuModel(gpu_uuid(i), i, mib << 20, f"vcuda test GPU {i}", (9, 0))
              for i, mib in enumerate(GPUS_MIB)]
    assert got["spec"]["driver"] == "vcuda.io" and got["spec"]["nodeName"] == p.NODE
    assert got["spec"]["devices"] == devices(models, Sharing())
    owner = got["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", p.NODE)



def test_the_agent_tells_its_node_of_its_gpus_as_on_the_other_paths(dra: Cluster) -> None:
    """The node agent's Events reach the Node on the DRA path too, through the DRA install's
    RBAC and the real events API (each mode's cluster starts empty: this is the DRA agent's)."""
    listed = p.node_events(dra, "GPUInventoryChanged")
    assert [(event["type"], event["reportingComponent"]) for event in listed] == [
        ("Normal", "vcuda.io/node-agent")]
    assert listed[0]["message"].startswith(
        f"the GPUs the hook may give containers are now {len(GPUS_MIB)}: 0: ")


def test_the_slice_policy_holds_the_agents_token_to_its_own_nodes_slice(dra: Cluster) -> None:
    """With the agent's pod-bound token (the node's name in it, as the real apiserver adds
    it) a slice of another node is refused; a token bound to no pod names no node."""
    agent = dra.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vcuda-node")
    pod = agent["items"][0]["metadata"]["name"]
    bound = dra.ok("create", "token", "-n", NAMESPACE, "vcuda-node", "--bound-object-kind",
                   "Pod", "--bound-object-name", pod).strip()
    unbound = dra.ok("create", "token", "-n", NAMESPACE, "vcuda-node").strip()
    other = dra.get("resourceslice", slice_name(p.NODE))
    other["metadata"] = {"name": slice_name("other-node")}
    other["spec"].update(nodeName="other-node", pool={**other["spec"]["pool"],
                                                      "name": "other-node"})
    refused = dra.as_token(bound, "create", "-f", "-", stdin=json.dumps(other))
    assert refused.returncode != 0
    assert (f"the vcuda node agent of node {p.NODE} may write only the vcuda.io "
            "ResourceSlices of that node") in refused.stderr
    refused = dra.as_token(unbound, "create", "-f", "-", stdin=json.dumps(other))
    assert refused.returncode != 0
    assert "the vcuda node agent's token names no node" in refused.stderr

def test_the_scheduler_puts_several_claims_on_one_gpu_by_their_consumed_capacity(
        templates: Cluster) -> None:
    """30 % and 10 GiB fits only the 16 GiB GPU; a whole GPU then takes the 8 GiB one; a
    20 % and 2 GiB claim joins the first on the 16 GiB GPU. Each container has its claim's
    limits, and a CUDA program in it sees the claim's memory (the whole GPU's: no limit)."""
    cluster = templates
    _create(cluster, _pod("share", "vcuda-30-10gi"))
    try:
        p.wait_running(cluster, "share")
        _create(cluster, _pod("whole", "vcuda-whole-gpu"))
        p.wait_running(cluster, "whole")
        _create(cluster, _pod("beside", "vcuda-20-2gi"))
        p.wait_running(cluster, "beside")
        assert _allocated(_claim(cluster, "share")) == (
            _gpu(0), {"cores": "30", "memory": "10Gi"})
        assert _allocated(_claim(cluster, "whole")) == (
            _gpu(1), {"cores": "100", "memory": "8Gi"})
        assert _allocated(_claim(cluster, "beside")) == (
            _gpu(0), {"cores": "20", "memory": "2Gi"})
        assert (_limits(cluster, "share").memory, _limits(cluster, "share").cores) == \
            (10 * GIB, 30)
        assert _limits(cluster, "share").devices == (gpu_uuid(0),)
        assert (_limits(cluster, "beside").memory, _limits(cluster, "beside").cores) == \
            (2 * GIB, 20)
        assert p.cuda_total(cluster, "share") == 10 * GIB
        assert p.cuda_total(cluster, "beside") == 2 * GIB
        assert p.cuda_total(cluster, "whole") == 8 * GIB  # the GPU's own: unlimited
        assert cluster.kubectl("exec", "-n", "default", "whole", "--", "test", "-e",
                               "/etc/vcuda/limits").returncode != 0
    finally:
        _delete(cluster, "share", "whole", "beside")


def test_a_claim_that_fits_no_gpu_stays_pending_with_the_schedulers_reason(
        templates: Cluster) -> None:
    """20 GiB of a compute capability 9.0 GPU (the examples' Hopper template): more memory
    than either GPU has."""
    cluster = templates
    _create(cluster, _pod("too-big", "vcuda-50-20gi-hopper"))
    try:
        events = cluster.events("too-big", "cannot allocate")
        assert "FailedScheduling" in _reasons(cluster, "too-big")
        assert "cannot allocate" in events, events
        assert p.stays_pending(cluster, "too-big", 5)
    finally:
        _delete(cluster, "too-big")


def test_kubelet_has_the_agent_prepare_a_claim_and_unprepare_it_after_the_pod(
        templates: Cluster) -> None:
    """The plugin registered with kubelet; the pod's claim is prepared before its container
    starts (its CDI spec and ledger record on the node) and unprepared once the pod is gone."""
    cluster = templates
    assert _agent_events(cluster, "dra_plugin_registered")
    _create(cluster, _pod("prepared", "vcuda-20-2gi"))
    try:
        p.wait_running(cluster, "prepared")
        uid = _claim(cluster, "prepared")["metadata"]["uid"]
        assert all(path.exists() for path in _claim_files(cluster, uid))
        assert any(e["uid"] == uid for e in _agent_events(cluster, "claim_prepared"))
    finally:
        _delete(cluster, "prepared")
    _until(lambda: any(e["uid"] == uid for e in _agent_events(cluster, "claim_unprepared")),
           "kubelet did not have the claim unprepared")
    assert not any(path.exists() for path in _claim_files(cluster, uid))


def test_a_claims_config_for_vcuda_reaches_its_allocation_and_the_node_agent(
        templates: Cluster) -> None:
    """The example's ShareConfig asking for virtual memory: the real apiserver takes it, the
    real scheduler copies it into the allocation, and the agent reads it at prepare. This
    node's agent does not scale memory, so the agent says so and the limit is all device
    memory (tests/dra/test_share_config.py: the split on a scaling node)."""
    cluster = templates
    _create(cluster, _pod("virtual", "vcuda-30-10gi-virtual"))
    try:
        p.wait_running(cluster, "virtual")
        claim = _claim(cluster, "virtual")
        [config] = claim["status"]["allocation"]["devices"]["config"]
        # 1.37.2 copies the claim's config without its requests ("all of them"), which
        # names the one request here just as well.
        assert config.get("requests", ["gpu"]) == ["gpu"]
        assert (config["source"], config["opaque"]) == ("FromClaim", {
            "driver": "vcuda.io", "parameters": {"apiVersion": "vcuda.io/v1alpha1",
                                                 "kind": "ShareConfig", "virtualMemory": True}})
        limits = _limits(cluster, "virtual")
        assert (limits.memory, limits.virtual_memory) == (10 * GIB, 0)
        name = f"default/{claim['metadata']['name']}"
        assert any(e["claim"] == name for e in _agent_events(cluster,
                                                              "claim_virtual_memory_refused"))
    finally:
        _delete(cluster, "virtual")


def _restart(component: str) -> None:
    subprocess.run([str(REPO / "scripts" / "cluster"), "restart", component], check=True,
                   timeout=120)


def _restart_agent(cluster: Cluster) -> None:
    cluster.ok("delete", "pod", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vcuda-node",
               "--wait=true")
    cluster.ok("rollout", "status", "-n", NAMESPACE, "daemonset/vcuda-node", "--timeout=180s")


@pytest.mark.parametrize("restart", ["kubelet", "node agent"])
def test_a_restart_keeps_a_running_claims_limits_and_prepares_a_new_pod(
        templates: Cluster, restart: str) -> None:
    cluster = templates
    _create(cluster, _pod("running", "vcuda-30-10gi"))
    try:
        p.wait_running(cluster, "running")
        container = cluster.get("pod", "running", "-n", "default")["status"][
            "containerStatuses"][0]["containerID"]
        before = _limits(cluster, "running")
        registered = len(_agent_events(cluster, "dra_plugin_registered"))
        if restart == "kubelet":
            _restart("kubelet")
        else:
            _restart_agent(cluster)
            registered = 0  # the new agent's log
        _until(lambda: len(_agent_events(cluster, "dra_plugin_registered")) > registered,
               "the plugin did not register again")
        assert cluster.get("pod", "running", "-n", "default")["status"][
            "containerStatuses"][0]["containerID"] == container  # not started again
        assert _limits(cluster, "running") == before
        # Kubelet deleted the node's slices when it started; the agent published its own
        # again when kubelet registered it, so the new pod is placed at its first try.
        assert cluster.kubectl("get", "resourceslice", slice_name(p.NODE)).returncode == 0
        _create(cluster, _pod("after", "vcuda-20-2gi"))
        p.wait_running(cluster, "after")
        assert "FailedScheduling" not in _reasons(cluster, "after")
        assert _allocated(_claim(cluster, "after"))[0] == _gpu(0)
        assert p.cuda_total(cluster, "after") == 2 * GIB
    finally:
        _delete(cluster, "running", "after")

