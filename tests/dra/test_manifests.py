"""The DRA manifests: valid for Kubernetes 1.34 and 1.36, wired as the driver needs, usable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import kubernetes_validate
import pytest
import yaml

from runtime_hook.contract import Sharing
from runtime_hook.node.dra.slices import GpuModel, resource_slice
from tests.deploy.manifests import ROOT, documents, find, kustomize, needs_kubectl
from tests.dra.scheduler import Allocator
from tests.node.fake_pynvml import GIB

DRA = ROOT / "dra"
VERSIONS = ("1.34", "1.36")
OBJECT_FILES = sorted([*DRA.glob("*.yaml"), *(DRA / "examples").glob("*.yaml")])
OBJECT_FILES = [p for p in OBJECT_FILES
                if p.name not in ("kustomization.yaml", "daemonset-patch.yaml")]


def _objects(name: str) -> list[dict[str, Any]]:
    return documents(DRA / name)


def _patched_daemonset() -> dict[str, Any]:
    patch = yaml.safe_load((DRA / "daemonset-patch.yaml").read_text())
    return jsonpatch.apply_patch(find("DaemonSet", "vcuda-node"), patch)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", OBJECT_FILES, ids=lambda p: str(p.relative_to(DRA)))
def test_every_dra_manifest_validates_strictly(path: Path, version: str) -> None:
    for obj in documents(path):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_patched_daemonset_validates_strictly(version: str) -> None:
    kubernetes_validate.validate(_patched_daemonset(), version, strict=True)


def test_strict_validation_rejects_a_capacity_request_in_the_wrong_place() -> None:
    [template, *_] = _objects("examples/claim-templates.yaml")
    request = template["spec"]["spec"]["devices"]["requests"][0]
    request["capacity"] = request["exactly"].pop("capacity")  # belongs under exactly
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(template, "1.34", strict=True)


def test_the_overlay_lists_the_base_and_every_dra_manifest_and_patches_the_node_daemonset(
) -> None:
    kustomization = yaml.safe_load((DRA / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert set(kustomization["resources"]) == {"../base"} | {
        p.name for p in OBJECT_FILES if p.parent == DRA}
    [patch] = kustomization["patches"]
    assert patch["path"] == "daemonset-patch.yaml"
    assert patch["target"]["kind"] == "DaemonSet" and patch["target"]["name"] == "vcuda-node"


@needs_kubectl
def test_the_overlay_builds_the_whole_install_with_the_patched_agent_and_the_dra_objects(
) -> None:
    objects = kustomize(DRA)
    [daemonset] = [o for o in objects
                   if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "vcuda-node"]
    assert daemonset == {**_patched_daemonset(), "metadata": daemonset["metadata"]}
    assert {_name(o) for o in kustomize(ROOT)} < {_name(o) for o in objects}
    kinds = {o["kind"] for o in objects}
    assert {"DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vcuda"
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def _name(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def test_the_agent_runs_as_the_dra_driver_and_its_mounts_reach_the_host() -> None:
    spec = _patched_daemonset()["spec"]["template"]["spec"]
    [agent] = [c for c in spec["containers"] if c["name"] == "agent"]
    assert agent["command"][:5] == ["vcuda-node", "run", "--host-root", "/host", "--dra"]
    # Each claim's account tmpfs is mounted by the agent and bound by the runtime.
    [host] = [m for m in agent["volumeMounts"] if m["mountPath"] == "/host"]
    assert host["mountPropagation"] == "Bidirectional"
    assert agent["securityContext"]["privileged"] is True  # Bidirectional requires it
    assert spec["hostPID"] is True  # the ledger's release of ended containers reads /proc
    [volume] = [v for v in spec["volumes"] if v["name"] == host["name"]]
    assert volume["hostPath"]["path"] == "/"  # kubelet's plugin directories and /var/run/cdi


def test_the_driver_may_read_claims_and_write_slices_and_nothing_more() -> None:
    """Its calls (runtime_hook/node/dra/kube.py): get claims; get, create, replace slices."""
    [role] = [o for o in _objects("rbac.yaml") if o["kind"] == "ClusterRole"]
    grants = {(r["resources"][0], verb) for r in role["rules"] for verb in r["verbs"]}
    assert grants == {("resourceclaims", "get"), ("resourceslices", "get"),
                      ("resourceslices", "create"), ("resourceslices", "update")}
    [binding] = [o for o in _objects("rbac.yaml") if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "vcuda-node",
                                    "namespace": "vcuda-system"}]
    [policy_binding] = [o for o in _objects("slice-policy.yaml")
                        if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert policy_binding["spec"]["validationActions"] == ["Deny"]


def _device(driver: str) -> Any:
    return celpy.json_to_cel({"driver": driver, "attributes": {}, "capacity": {}})


def test_the_device_class_selects_vcuda_devices_only() -> None:
    [device_class] = _objects("deviceclass.yaml")
    env = celpy.Environment()
    [selector] = device_class["spec"]["selectors"]
    program = env.program(env.compile(selector["cel"]["expression"]))
    assert program.evaluate({"device": _device("vcuda.io")})
    assert not program.evaluate({"device": _device("gpu.nvidia.com")})


def test_the_example_templates_allocate_what_they_say_on_an_h100() -> None:
    h100 = GpuModel("GPU-0b5e1d2a-9c41-4f6e-8d3b-5a6f7e8d9c01", 0, 80 * GIB,
                    "NVIDIA H100 80GB HBM3", (9, 0))
    consumed = {}
    for template in _objects("examples/claim-templates.yaml"):
        allocator = Allocator([resource_slice("node-a", [h100], Sharing(), 1)])
        claim = {"spec": template["spec"]["spec"]}
        assert allocator.allocate(claim), template["metadata"]["name"]
        [result] = claim["status"]["allocation"]["devices"]["results"]
        consumed[template["metadata"]["name"]] = result["consumedCapacity"]
    assert consumed == {
        "vcuda-30-10gi": {"cores": "30", "memory": "10Gi"},
        "vcuda-whole-gpu": {"cores": "100", "memory": "80Gi"},
        "vcuda-50-20gi-hopper": {"cores": "50", "memory": "20Gi"},
        "vcuda-30-10gi-virtual": {"cores": "30", "memory": "10Gi"},
    }


def test_the_example_pod_uses_a_template_that_exists() -> None:
    [pod] = _objects("examples/pod.yaml")
    names = {t["metadata"]["name"] for t in _objects("examples/claim-templates.yaml")}
    [claim] = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] in names
    assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": claim["name"]}]
