"""Virtual device memory: past its device part, a limit's allocations live in host memory."""

from __future__ import annotations

import pytest

from runtime_hook.contract import Limits, LimitsFormatError, parse_limits, render_limits
from tests.shim.harness import CONTEXT, GIB, FakeGpu, info


def _device_used(gpu: FakeGpu) -> int:
    """Bytes the device itself holds, as NVML tells a process without the library."""
    nvml = gpu.lines("nvml", shim=False)[0]
    return int(nvml[6])


def test_allocations_past_the_device_part_live_in_host_memory_up_to_the_limit(
    gpu: FakeGpu,
) -> None:
    gpu.limit(4 * GIB, virtual=2 * GIB)
    words = ("init", "ctx", "0", "alloc", "1G", "alloc", "1G", "alloc", "1G", "alloc", "1G")
    with gpu.running(*words, "info", "wait") as probe:
        assert [line[:2] for line in probe.lines[2:6]] == [
            ["alloc", "CUDA_SUCCESS"],
            ["alloc", "CUDA_SUCCESS"],
            ["alloc", "CUDA_SUCCESS"],
            ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"],  # the whole limit, both parts, is taken
        ]
        free, total = info(probe.lines)
        assert (total, free) == (4 * GIB, 4 * GIB - CONTEXT - 3 * GIB)
        # The context and the first GiB on the device; the two others in host memory.
        assert _device_used(gpu) == CONTEXT + 1 * GIB


def test_a_freed_host_allocation_gives_its_room_back(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB, virtual=2 * GIB)
    lines = gpu.lines("init", "ctx", "0", "alloc", "1G", "alloc", "2G", "free", "1",
                      "alloc", "2G", "info")
    assert [line[:2] for line in lines[2:6]] == [
        ["alloc", "CUDA_SUCCESS"], ["alloc", "CUDA_SUCCESS"], ["free", "CUDA_SUCCESS"],
        ["alloc", "CUDA_SUCCESS"],
    ]
    assert info(lines) == (4 * GIB - CONTEXT - 3 * GIB, 4 * GIB)


def test_allocators_that_cannot_use_host_memory_get_the_device_part_only(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB, virtual=2 * GIB)
    lines = gpu.lines("init", "ctx", "0", "pitch", "1024", "2M", "alloc", "2G", "info")
    assert lines[2] == ["pitch", "CUDA_ERROR_OUT_OF_MEMORY"]  # 2 GiB of rows: past the device part
    assert lines[3][:2] == ["alloc", "CUDA_SUCCESS"]  # the same bytes, in host memory
    assert info(lines) == (4 * GIB - CONTEXT - 2 * GIB, 4 * GIB)


def test_a_limit_past_the_devices_size_reports_the_limit(gpu: FakeGpu) -> None:
    gpu.limit(12 * GIB, virtual=6 * GIB)  # 6 GiB on the 8 GiB device, 6 in host memory
    lines = gpu.lines("init", "ctx", "0", "alloc", "9G", "info", "total", "0")
    assert lines[2][:2] == ["alloc", "CUDA_SUCCESS"]
    assert info(lines) == (12 * GIB - CONTEXT - 9 * GIB, 12 * GIB)
    assert lines[4] == ["total", "CUDA_SUCCESS", str(12 * GIB)]


def test_processes_of_one_container_share_both_parts(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB, virtual=2 * GIB)
    with gpu.running("init", "ctx", "0", "alloc", "1G", "alloc", "1G", "wait"):
        lines = gpu.lines("init", "ctx", "0", "alloc", "1G", "alloc", "512M", "alloc", "512M",
                          "info")
        # The first holds its context and 1 GiB on the device, 1 GiB in host memory. Here the
        # GiB finds no device room after this context (host memory), the next 512 MiB do
        # (device), and then the limit is reached.
        assert [line[:2] for line in lines[2:5]] == [
            ["alloc", "CUDA_SUCCESS"], ["alloc", "CUDA_SUCCESS"],
            ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"],
        ]
        assert info(lines)[0] == 4 * GIB - 2 * CONTEXT - 3 * GIB - GIB // 2


def test_without_virtual_memory_the_device_part_is_the_whole_limit(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "alloc", "3G", "alloc", "1G")
    assert [line[:2] for line in lines[2:4]] == [
        ["alloc", "CUDA_SUCCESS"], ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"],
    ]


def test_the_limits_file_carries_virtual_memory_and_reads_back() -> None:
    limits = Limits(memory=8 * GIB, virtual_memory=3 * GIB)
    assert "virtual-memory=3221225472\n" in render_limits(limits)
    assert parse_limits(render_limits(limits)) == limits
    assert "virtual-memory" not in render_limits(Limits(memory=8 * GIB))


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("virtual-memory=8589934592", "virtual-memory must be less than memory (8589934592), "
                                      "got 8589934592"),
        ("virtual-memory=-1", "virtual-memory must be a whole number of bytes"),
        ("virtual-memory=2G", "virtual-memory must be a whole number of bytes"),
    ],
)
def test_a_bad_virtual_memory_is_refused_by_the_hook_and_by_the_library(
    gpu: FakeGpu, line: str, error: str
) -> None:
    text = f"version=1\nmemory={8 * GIB}\n{line}\n"
    with pytest.raises(LimitsFormatError) as refused:
        parse_limits(text)
    assert str(refused.value) == error
    path = gpu.root / "limits"
    path.write_text(text)
    gpu.env["VCUDA_LIMITS_FILE"] = str(path)
    result = gpu.run("init", "ctx", "0", "alloc", "1G")
    assert error in result.stderr
