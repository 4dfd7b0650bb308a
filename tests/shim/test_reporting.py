"""cuMemGetInfo, cuDeviceTotalMem and NVML report the limit and the container's use."""

from __future__ import annotations

import os

from tests.shim.harness import (
    CONTEXT,
    GIB,
    FakeGpu,
    account_used,
    fake_uuid,
    info,
    start_time,
    write_slot,
)


def test_cuMemGetInfo_reports_the_limit_as_total_and_what_is_left_as_free(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    free, total = info(gpu.lines("init", "ctx", "0", "alloc", "1G", "info"))
    assert (free, total) == (4 * GIB - CONTEXT - 1 * GIB, 4 * GIB)


def test_cuDeviceTotalMem_reports_the_limit(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    assert gpu.lines("init", "total", "0")[1] == ["total", "CUDA_SUCCESS", str(4 * GIB)]


def test_a_limit_above_the_device_reports_the_device(gpu: FakeGpu) -> None:
    gpu.limit(64 * GIB)
    lines = gpu.lines("init", "ctx", "0", "total", "0", "info")
    assert lines[2] == ["total", "CUDA_SUCCESS", str(8 * GIB)]
    assert info(lines) == (8 * GIB - CONTEXT, 8 * GIB)


def test_free_is_zero_not_an_error_when_the_container_is_over_its_limit(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    with gpu.running("init", "ctx", "0", "wait", "info") as probe:
        # Another process of the container (alive: it is this test) holds more than the limit.
        write_slot(gpu.account, 1, os.getpid(), start_time(os.getpid()), 5 * GIB)
        assert info(probe.resume()) == (0, 4 * GIB)


def test_nvml_reports_the_limit_and_the_containers_use(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "alloc", "1G", "nvml")
    used = CONTEXT + 1 * GIB
    v1_ok, total, free, in_use, v2_ok, total2, reserved, free2, in_use2 = map(int, lines[3][3:12])
    assert lines[3][:3] == ["nvml", "0", fake_uuid(0)]
    assert (v1_ok, total, free, in_use) == (0, 4 * GIB, 4 * GIB - used, used)
    assert (v2_ok, total2, reserved, free2, in_use2) == (0, 4 * GIB, 0, 4 * GIB - used, used)


def test_nvml_in_a_process_without_cuda_sees_the_whole_containers_use(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    with gpu.running("init", "ctx", "0", "alloc", "2G", "wait"):
        nvml = gpu.lines("nvml")[0]
        assert (int(nvml[4]), int(nvml[6])) == (4 * GIB, CONTEXT + 2 * GIB)


def test_nvml_reports_no_memory_on_a_device_the_limits_do_not_list(two_gpus: FakeGpu) -> None:
    two_gpus.limit(4 * GIB, devices=(fake_uuid(1),))
    lines = two_gpus.lines("nvml")
    assert [int(line[4]) for line in lines] == [0, 4 * GIB]


def test_the_limit_follows_the_uuid_whatever_order_CUDA_VISIBLE_DEVICES_gives(
    two_gpus: FakeGpu,
) -> None:
    two_gpus.limit(4 * GIB, devices=(fake_uuid(0),))
    for visible in ("1,0", f"{fake_uuid(1)},{fake_uuid(0)}", f"{fake_uuid(1)[:12]},0"):
        lines = two_gpus.lines("init", "total", "0", "total", "1", CUDA_VISIBLE_DEVICES=visible)
        # Ordinal 0 is physical device 1 (not listed: refused); ordinal 1 is device 0.
        assert [line[2] for line in lines[1:]] == ["0", str(4 * GIB)], visible


def test_the_account_file_holds_the_bytes_in_use_per_device_uuid(two_gpus: FakeGpu) -> None:
    two_gpus.limit(4 * GIB)
    with two_gpus.running("init", "ctx", "1", "alloc", "1G", "wait"):
        assert account_used(two_gpus.account) == {fake_uuid(1): CONTEXT + 1 * GIB}
