"""The limits follow a device's UUID as NVIDIA matches it: any case, GPU or MIG; nothing unlisted
runs unlimited."""

from __future__ import annotations

from tests.shim.harness import CONTEXT, GIB, FakeGpu, account_used, fake_uuid


def test_a_uuid_written_in_capitals_limits_its_device(two_gpus: FakeGpu) -> None:
    two_gpus.limit(1 * GIB, devices=(fake_uuid(0).upper(),))
    lines = two_gpus.lines("init", "total", "0", "ctx", "0", "alloc", "2G", "total", "1")
    assert lines[1] == ["total", "CUDA_SUCCESS", str(GIB)]
    assert lines[3] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert lines[4] == ["total", "CUDA_SUCCESS", "0"], "the other device is refused"


def test_the_account_names_the_device_as_nvml_prints_it(gpu: FakeGpu) -> None:
    gpu.limit(1 * GIB, devices=(fake_uuid(0).upper(),))
    with gpu.running("init", "ctx", "0", "wait"):
        assert account_used(gpu.account) == {fake_uuid(0): CONTEXT}


def test_a_mig_uuid_limits_the_device_whose_uuid_it_names(gpu: FakeGpu) -> None:
    # A MIG device's UUID reads MIG-<the bytes cuDeviceGetUuid_v2 gives for it>.
    mig = "MIG-" + fake_uuid(0)[4:]
    gpu.limit(1 * GIB, devices=(mig,))
    with gpu.running("init", "ctx", "0", "alloc", "256M", "alloc", "1G", "wait") as probe:
        assert probe.lines[2][:2] == ["alloc", "CUDA_SUCCESS"]
        assert probe.lines[3] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
        assert list(account_used(gpu.account)) == [mig]


def test_a_devices_entry_that_is_not_a_uuid_matches_no_device(gpu: FakeGpu) -> None:
    gpu.limit(1 * GIB, devices=("GPU-0",))
    lines = gpu.lines("init", "ctx", "0", "nvml")
    assert lines[1] == ["ctx", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert lines[2][4] == "0"


def test_a_tenant_pointing_cuda_at_another_gpu_gets_no_memory_there(two_gpus: FakeGpu) -> None:
    two_gpus.limit(1 * GIB, devices=(fake_uuid(1),))
    lines = two_gpus.lines("init", "ctx", "0", "alloc", "1M", CUDA_VISIBLE_DEVICES=fake_uuid(0))
    assert lines[1] == ["ctx", "CUDA_ERROR_OUT_OF_MEMORY"]
