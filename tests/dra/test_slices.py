"""The ResourceSlice: what it offers per GPU, valid for Kubernetes 1.34 and 1.36, kept current."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import kubernetes_validate
import pytest

from runtime_hook.contract import Gpu, Sharing
from runtime_hook.node.dra.kube import DraApi, DraApiError
from runtime_hook.node.dra.publish import publish
from runtime_hook.node.dra.slices import GpuModel, device_name, resource_slice, slice_name
from runtime_hook.node.logs import Problems
from tests.dra.conftest import GPU0, GPU1, NODE, DraNode
from tests.dra.fake_dra_api import FakeDraApi, slice_path
from tests.node.fake_pynvml import GIB

VERSIONS = ("1.34", "1.36")
H100 = GpuModel(GPU0, 0, 80 * GIB + 123, "NVIDIA H100 80GB HBM3", (9, 0))
L4 = GpuModel(GPU1, 1, 23034 << 20, "NVIDIA L4", (8, 9))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("sharing", [Sharing(), Sharing(1.5, 1.2, 10)])
def test_the_slice_validates_strictly_against_the_kubernetes_schema(
        version: str, sharing: Sharing) -> None:
    body = resource_slice(NODE, [H100, L4], sharing, 3)
    kubernetes_validate.validate(body, version, strict=True)


def test_a_misspelt_capacity_field_fails_the_same_strict_validation() -> None:
    body = resource_slice(NODE, [H100], Sharing(), 1)
    body["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"]["validRange"]["stepSize"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(body, "1.34", strict=True)


def test_each_gpu_is_a_shareable_device_with_cores_and_memory_in_their_steps() -> None:
    spec = resource_slice(NODE, [L4, H100], Sharing(), 7)["spec"]
    assert spec["driver"] == "vcuda.io" and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 7, "resourceSliceCount": 1}
    h100, l4 = spec["devices"]  # by index
    assert h100["name"] == "gpu-0b5e1d2a-9c41-4f6e-8d3b-5a6f7e8d9c01"
    assert h100["allowMultipleAllocations"] is True
    assert h100["attributes"] == {
        "uuid": {"string": GPU0}, "index": {"int": 0},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "cudaComputeCapability": {"version": "9.0.0"}}
    assert h100["capacity"]["cores"] == {"value": "100", "requestPolicy": {
        "default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}}}
    assert h100["capacity"]["memory"] == {"value": "80Gi", "requestPolicy": {
        "default": "80Gi", "validRange": {"min": "256Mi", "max": "80Gi", "step": "256Mi"}}}
    # 23034 MiB is 89 whole steps of 256 MiB: 22784 MiB.
    assert l4["capacity"]["memory"]["value"] == "22784Mi"
    assert l4["attributes"]["cudaComputeCapability"] == {"version": "8.9.0"}


def test_memory_scaling_multiplies_each_gpus_memory_before_rounding() -> None:
    [device] = resource_slice(NODE, [H100], Sharing(1.5), 1)["spec"]["devices"]
    assert device["capacity"]["memory"]["value"] == "120Gi"


def test_cores_scaling_raises_the_cores_capacity_and_no_cap_means_no_sharers_capacity() -> None:
    [device] = resource_slice(NODE, [H100], Sharing(cores_scaling=1.2), 1)["spec"]["devices"]
    assert device["capacity"]["cores"] == {"value": "120", "requestPolicy": {
        "default": "120", "validRange": {"min": "1", "max": "120", "step": "1"}}}
    assert "sharers" not in device["capacity"]


def test_max_sharers_is_a_capacity_of_which_every_claim_consumes_one() -> None:
    [device] = resource_slice(NODE, [H100], Sharing(max_sharers=10), 1)["spec"]["devices"]
    assert device["capacity"]["sharers"] == {
        "value": "10", "requestPolicy": {"default": "1", "validValues": ["1"]}}


def test_device_names_are_dns_labels_that_do_not_follow_the_index() -> None:
    assert device_name("GPU-0B5E1D2A-9C41-4F6E-8D3B-5A6F7E8D9C01") == \
        "gpu-0b5e1d2a-9c41-4f6e-8d3b-5a6f7e8d9c01"
    assert device_name("MIG-4f6e8d3b-5a6f-7e8d-9c01-0b5e1d2a9c41") == \
        "mig-4f6e8d3b-5a6f-7e8d-9c01-0b5e1d2a9c41"
    moved = GpuModel(GPU0, 5, H100.memory, H100.product, H100.compute_capability)
    assert resource_slice(NODE, [moved], Sharing(), 1)["spec"]["devices"][0]["name"] == \
        resource_slice(NODE, [H100], Sharing(), 1)["spec"]["devices"][0]["name"]


def test_a_long_node_name_still_gives_a_valid_slice_name() -> None:
    node = "n" * 250
    name = slice_name(node)
    assert len(name) <= 253 and name.endswith("-vcuda.io") and name != slice_name("n" * 249)


# --- publishing through the API stand-in ------------------------------------------------------

def _api(dra_api: FakeDraApi, tmp_path: Path) -> DraApi:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(dra_api.kubeconfig())
    return DraApi(str(kubeconfig))


def test_publishing_creates_the_slice_then_changes_it_only_when_the_gpus_change(
        dra_api: FakeDraApi, tmp_path: Path) -> None:
    api = _api(dra_api, tmp_path)
    assert publish(api, NODE, [H100], Sharing()) == "created"
    assert publish(api, NODE, [H100], Sharing()) is None
    assert publish(api, NODE, [H100, L4], Sharing()) == "updated"
    stored = dra_api.get(slice_path(slice_name(NODE)))
    assert stored["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in stored["spec"]["devices"]] == [device_name(GPU0), device_name(GPU1)]


def test_publishing_repairs_a_slice_someone_else_changed(
        dra_api: FakeDraApi, tmp_path: Path) -> None:
    api = _api(dra_api, tmp_path)
    publish(api, NODE, [H100], Sharing())
    path = slice_path(slice_name(NODE))
    edited = copy.deepcopy(dra_api.get(path))
    edited["spec"]["devices"][0]["capacity"]["cores"]["value"] = "1000"
    dra_api.put(path, edited)
    assert publish(api, NODE, [H100], Sharing()) == "updated"
    assert dra_api.get(path)["spec"]["devices"][0]["capacity"]["cores"]["value"] == "100"


def test_the_node_owns_the_slice_the_driver_publishes(dra_node: DraNode) -> None:
    stored = dra_node.api.get(slice_path(slice_name(NODE)))
    node = dra_node.api.get(f"/api/v1/nodes/{NODE}")
    assert stored["metadata"]["ownerReferences"] == [{
        "apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"],
        "controller": True}]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_slice_with_its_owner_validates_strictly(version: str) -> None:
    body = resource_slice(NODE, [H100], Sharing(), 1,
                          node_uid="5e0b6f5c-2d7a-4b8e-9f31-0c1d2e3f4a5b")
    kubernetes_validate.validate(body, version, strict=True)


def test_fields_the_api_server_adds_are_no_reason_to_write_again(
        dra_api: FakeDraApi, tmp_path: Path) -> None:
    api = _api(dra_api, tmp_path)
    publish(api, NODE, [H100], Sharing())
    path = slice_path(slice_name(NODE))
    stored = copy.deepcopy(dra_api.get(path))
    stored["spec"]["devices"][0]["bindsToNode"] = False  # as a defaulting server might
    stored["metadata"]["labels"]["extra"] = "kept"
    dra_api.put(path, stored)
    assert publish(api, NODE, [H100], Sharing()) is None
    assert dra_api.get(path)["spec"]["pool"]["generation"] == 1


def test_the_policy_refuses_a_slice_for_another_node(
        dra_api: FakeDraApi, tmp_path: Path) -> None:
    dra_api.node_name = "gpu-node-2"  # the agent's token is bound to another node
    api = _api(dra_api, tmp_path)
    with pytest.raises(DraApiError, match=r"cannot create resourceslice gpu-node-1-vcuda\.io: "
                       r"HTTP 422: .* the vcuda node agent of node gpu-node-2 may write only "
                       r"the vcuda\.io ResourceSlices of that node"):
        publish(api, NODE, [H100], Sharing())
    dra_api.node_name = None  # a token without the node's name (not a pod-bound one)
    with pytest.raises(DraApiError, match="the vcuda node agent's token names no node"):
        publish(api, NODE, [H100], Sharing())


def test_the_driver_reports_a_slice_it_cannot_write_and_keeps_running(
        dra_node: DraNode, log: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    dra_node.api.rules = []
    problems = Problems(log, "advertise")
    gpus = [Gpu(GPU0, 0, 16 * GIB), Gpu(GPU1, 1, 40 * GIB + (1 << 30))]  # GPU1 changed
    with caplog.at_level(logging.WARNING):
        dra_node.driver.publish(dra_node.nvml, gpus, problems)
    [record] = [r for r in caplog.records if r.fields.get("source") == "resourceslice"]
    assert record.fields["reason"].startswith(
        "not allowed to get resourceslice gpu-node-1-vcuda.io: ")
    assert record.fields["reason"].endswith(
        "; fix: grant it with manifests/dra/rbac.yaml (get resourceclaims; get, create, update "
        "resourceslices) and manifests/base/node-rbac.yaml (get nodes)")
