"""The gRPC protocol loader: upstream method paths and field numbers, clear errors."""

from __future__ import annotations

import pytest

from runtime_hook.node.protos import load


def _method_paths(name: str) -> set[str]:
    messages, _ = load(name)
    return {f"/{service.full_name}/{method.name}"
            for service in messages.DESCRIPTOR.services_by_name.values()
            for method in service.methods}


def test_dra_methods_have_the_paths_kubelet_calls() -> None:
    assert _method_paths("dra") == {
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    }


def test_registration_methods_have_the_paths_kubelet_calls() -> None:
    assert _method_paths("pluginregistration") == {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    }


def test_messages_keep_upstream_field_numbers_on_the_wire() -> None:
    messages, _ = load("dra")
    device = messages.Device(request_names=["gpu"], pool_name="node-a", device_name="gpu-0",
                             cdi_device_ids=["vcuda.io/claim=x"])
    numbers = {f.name: f.number for f in messages.Device.DESCRIPTOR.fields}
    assert numbers == {"request_names": 1, "pool_name": 2, "device_name": 3,
                       "cdi_device_ids": 4}
    # Field 3 (device_name) as protobuf encodes it: tag (3 << 3 | 2), length, bytes.
    assert bytes([3 << 3 | 2, 5]) + b"gpu-0" in device.SerializeToString()
    claim = {f.name: f.number for f in messages.Claim.DESCRIPTOR.fields}
    assert claim == {"namespace": 1, "uid": 2, "name": 3}
    registration, _ = load("pluginregistration")
    info = {f.name: f.number for f in registration.PluginInfo.DESCRIPTOR.fields}
    assert info == {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}


def test_loading_the_same_protocol_twice_gives_the_same_classes() -> None:
    assert load("dra")[0].Claim is load("dra")[0].Claim


def test_an_unknown_protocol_is_refused_with_its_path() -> None:
    with pytest.raises(FileNotFoundError, match=r"no protocol 'nope': .*nope\.proto is missing"):
        load("nope")
