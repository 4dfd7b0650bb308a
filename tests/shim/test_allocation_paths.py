"""Every allocation path counts against the limit, is refused past it, and gives back on free."""

from __future__ import annotations

import pytest

from tests.shim.harness import CONTEXT, GIB, MIB, FakeGpu, fake_uuid, info

MODES = ["link", "dlsym", "getproc", "getproc-ptsz"]


def used(gpu: FakeGpu, *words: str, mode: str = "link") -> tuple[list[list[str]], int]:
    """Run init, a context and ``words`` then info; return the lines and the bytes in use."""
    lines = gpu.lines("init", "ctx", "0", *words, "info", mode=mode)
    free, total = info(lines)
    return lines, total - free


@pytest.mark.parametrize("mode", MODES)
def test_allocations_past_the_limit_fail_with_out_of_memory_on_every_binding(
    gpu: FakeGpu, mode: str
) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, "fill", "256M", mode=mode)
    fill = next(line for line in lines if line[0] == "fill")
    assert fill == ["fill", str((4 * GIB - CONTEXT) // (256 * MIB)), "CUDA_ERROR_OUT_OF_MEMORY"]
    assert in_use == CONTEXT + int(fill[1]) * 256 * MIB


def test_without_the_shim_the_same_program_fills_the_whole_device(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "fill", "256M", shim=False)
    count = (8 * GIB - CONTEXT) // (256 * MIB)
    assert lines[-1] == ["fill", str(count), "CUDA_ERROR_OUT_OF_MEMORY"]


def test_a_free_gives_the_memory_back(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, "alloc", "3G", "alloc", "2G", "free", "0", "alloc", "2G")
    assert [line[:2] for line in lines[2:6]] == [
        ["alloc", "CUDA_SUCCESS"],
        ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"],
        ["free", "CUDA_SUCCESS"],
        ["alloc", "CUDA_SUCCESS"],
    ]
    assert in_use == CONTEXT + 2 * GIB


def test_pitched_allocations_count_the_padded_pitch(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, "pitch", "1000", "1M")
    assert lines[2][:3] == ["pitch", "CUDA_SUCCESS", "1024"]
    assert in_use == CONTEXT + 1024 * MIB


def test_pitched_allocation_past_the_limit_is_refused(gpu: FakeGpu) -> None:
    gpu.limit(1 * GIB)
    lines, in_use = used(gpu, "pitch", "1000", "1M")
    assert lines[2] == ["pitch", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert in_use == CONTEXT


def test_managed_memory_counts_and_is_refused_past_the_limit(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, "managed", "3G", "managed", "1G", "free", "0")
    assert [line[:2] for line in lines[2:5]] == [
        ["managed", "CUDA_SUCCESS"],
        ["managed", "CUDA_ERROR_OUT_OF_MEMORY"],
        ["free", "CUDA_SUCCESS"],
    ]
    assert in_use == CONTEXT


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        # 4096 floats a row: 16 KiB, already a multiple of the 512-byte row padding.
        (("array", "4096", "4096"), 64 * MIB),
        # 1000 floats a row pad to 4096 bytes.
        (("array3d", "1000", "1024", "64"), 4096 * 1024 * 64),
        # Levels of 4096², 2048², 1024², 512² floats.
        (("mipmap", "4096", "4096", "4"), (64 + 16 + 4 + 1) * MIB),
    ],
)
def test_arrays_count_what_the_driver_says_they_take(
    gpu: FakeGpu, words: tuple[str, ...], expected: int
) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, *words)
    assert lines[2][:2] == [words[0], "CUDA_SUCCESS"]
    assert in_use == CONTEXT + expected
    _, after_free = used(gpu, *words, "free", "0")
    assert after_free == CONTEXT


@pytest.mark.parametrize("words", [("array", "32768", "32768"), ("mipmap", "32768", "32768", "2")])
def test_arrays_past_the_limit_are_refused(gpu: FakeGpu, words: tuple[str, ...]) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, *words)
    assert lines[2] == [words[0], "CUDA_ERROR_OUT_OF_MEMORY"]
    assert in_use == CONTEXT


def test_vmm_handles_count_until_released(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, "vmm", "2G", "0", "vmm", "2G", "0", "free", "0", "vmm", "1G", "0")
    assert [line[:2] for line in lines[2:6]] == [
        ["vmm", "CUDA_SUCCESS"],
        ["vmm", "CUDA_ERROR_OUT_OF_MEMORY"],
        ["free", "CUDA_SUCCESS"],
        ["vmm", "CUDA_SUCCESS"],
    ]
    assert in_use == CONTEXT + 1 * GIB


def test_vmm_size_the_driver_rejects_leaves_nothing_charged(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, "granularity", "vmm", "3M", "0")
    assert lines[2] == ["granularity", "CUDA_SUCCESS", str(2 * MIB)]
    assert lines[3] == ["vmm", "CUDA_ERROR_INVALID_VALUE"]
    assert in_use == CONTEXT


def test_vmm_memory_counts_on_the_device_it_is_placed_on(two_gpus: FakeGpu) -> None:
    two_gpus.limit(4 * GIB)
    lines = two_gpus.lines("init", "ctx", "0", "vmm", "3G", "1", "vmm", "3G", "0", "vmm", "3G", "1")
    assert [line[:2] for line in lines[2:]] == [
        ["vmm", "CUDA_SUCCESS"],
        ["vmm", "CUDA_SUCCESS"],
        ["vmm", "CUDA_ERROR_OUT_OF_MEMORY"],
    ]


def test_stream_ordered_allocations_count_the_pool_until_it_returns_memory(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    words = ("async", "3G", "freeasync", "0", "alloc", "2G", "sync", "alloc", "2G")
    lines, in_use = used(gpu, *words)
    assert [line[:2] for line in lines[2:7]] == [
        ["async", "CUDA_SUCCESS"],
        ["freeasync", "CUDA_SUCCESS"],
        # Freed into the pool but still held by it: 2 GiB more does not fit.
        ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"],
        ["sync", "CUDA_SUCCESS"],
        # The synchronization returned the pool's memory to the device.
        ["alloc", "CUDA_SUCCESS"],
    ]
    assert in_use == CONTEXT + 2 * GIB


def test_memory_a_pool_still_holds_is_reused_without_a_new_charge(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, "async", "3G", "freeasync", "0", "async", "3G")
    assert lines[4][:2] == ["async", "CUDA_SUCCESS"]
    assert in_use == CONTEXT + 3 * GIB


@pytest.mark.parametrize("mode", ["getproc", "getproc-ptsz"])
def test_explicit_pools_count_and_trimming_gives_back(gpu: FakeGpu, mode: str) -> None:
    gpu.limit(4 * GIB)
    words = ("pool", "2G", "pool", "1G", "freeasync", "0", "pool", "2G", "trim", "0", "info")
    lines, in_use = used(gpu, *words, mode=mode)
    assert [line[:2] for line in lines[2:6]] == [
        ["pool", "CUDA_SUCCESS"],
        ["pool", "CUDA_SUCCESS"],
        ["freeasync", "CUDA_SUCCESS"],
        ["pool", "CUDA_SUCCESS"],
    ]
    assert in_use == CONTEXT + 3 * GIB
    _, after_destroy = used(gpu, *words, "pooldestroy")
    assert after_destroy == CONTEXT


def test_a_pool_of_host_memory_does_not_count(gpu: FakeGpu) -> None:
    gpu.limit(1 * GIB)
    lines, in_use = used(gpu, "hostpool", "2G")
    assert lines[2][:2] == ["hostpool", "CUDA_SUCCESS"]
    assert in_use == CONTEXT


def test_each_created_context_counts_and_destroying_it_frees_its_allocations(
    gpu: FakeGpu,
) -> None:
    gpu.limit(4 * GIB)
    lines, in_use = used(gpu, "ctxnew", "0", "alloc", "1G", "info", "ctxdestroy", "0", "ctx", "0")
    free, total = info(lines[:5])
    assert total - free == 2 * CONTEXT + 1 * GIB
    assert lines[5] == ["ctxdestroy", "CUDA_SUCCESS"]
    assert in_use == CONTEXT


def test_releasing_the_primary_context_frees_its_allocations(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "alloc", "3G", "release", "0", "ctx", "0", "info")
    free, total = info(lines)
    assert total - free == CONTEXT


def test_resetting_the_primary_context_frees_its_allocations(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "alloc", "3G", "reset", "0", "ctx", "0", "info")
    free, total = info(lines)
    assert total - free == CONTEXT


def test_a_context_that_does_not_fit_fails_out_of_memory_and_charges_nothing(
    gpu: FakeGpu,
) -> None:
    gpu.limit(1 * GIB)
    lines, in_use = used(gpu, "alloc", "900M", "ctxnew", "0", "alloc", "1M")
    assert lines[2][:2] == ["alloc", "CUDA_SUCCESS"]
    assert lines[3] == ["ctxnew", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert lines[4][:2] == ["alloc", "CUDA_SUCCESS"]
    assert in_use == CONTEXT + 901 * MIB


def test_a_second_process_whose_context_does_not_fit_gets_out_of_memory(gpu: FakeGpu) -> None:
    gpu.limit(1 * GIB)
    with gpu.running("init", "ctx", "0", "alloc", "900M", "wait"):
        lines = gpu.lines("init", "ctx", "0")
        outside = gpu.lines("init", "nvml", shim=False)
    assert lines[1] == ["ctx", "CUDA_ERROR_OUT_OF_MEMORY"]
    # The device never held more than the limit for the container: one context and 900 MiB.
    assert int(outside[1][6]) == CONTEXT + 900 * MIB


def test_a_context_larger_than_its_estimate_that_does_not_fit_is_destroyed(gpu: FakeGpu) -> None:
    # A process's first context is charged 512 MiB up front, then what it measures: 1000 MiB.
    gpu.limit(1 * GIB)
    with gpu.running("init", "ctx", "0", "wait", VCUDA_FAKE_CONTEXT_MIB="100"):
        lines = gpu.lines("init", "ctx", "0", VCUDA_FAKE_CONTEXT_MIB="1000")
        outside = gpu.lines("init", "nvml", shim=False)
    assert lines[1] == ["ctx", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert int(outside[1][6]) == 100 * MIB


def test_a_context_made_while_the_container_allocates_and_frees_is_charged_its_own_size(
    gpu: FakeGpu,
) -> None:
    # A context is measured by the device's used memory before and after it is
    # made: what another process of the container allocates or frees meanwhile
    # would count in or out of it. Freed, the context would look smaller, and
    # the container could hold that much past its limit. Here the parent
    # allocates and frees 64 MiB in a loop while its child makes 11 contexts.
    gpu.limit(4 * GIB)
    made = ";".join(["ctxnew 0"] * 10)
    lines = gpu.lines("init", "ctx", "0", "hammer", "64M", "fork", f"init;ctx 0;{made};info",
                      "hammer", "0")
    child = [line[1:] for line in lines if line[0] == "child"]
    assert [line[1] for line in child if line[0] == "ctxnew"] == ["CUDA_SUCCESS"] * 10
    # Twelve contexts in all, and the parent's 64 MiB if it held them then.
    free = info(child)[0]
    assert 4 * GIB - 12 * CONTEXT - 64 * MIB <= free <= 4 * GIB - 12 * CONTEXT, free


def test_a_driver_failure_gives_the_charge_back(shim_build: None, tmp_path) -> None:
    small = FakeGpu(tmp_path, gpus_mib=(2048,))
    small.limit(4 * GIB)
    lines, in_use = used(small, "alloc", "3G")
    assert lines[2] == ["alloc", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert in_use == CONTEXT


def test_a_device_the_limits_do_not_list_is_refused_at_context_creation(
    two_gpus: FakeGpu,
) -> None:
    two_gpus.limit(1 * GIB, devices=(fake_uuid(1),))
    lines = two_gpus.lines("init", "ctx", "0", "ctxnew", "0", "total", "0", "ctx", "1", "alloc",
                           "512M")
    assert lines[1:4] == [
        ["ctx", "CUDA_ERROR_OUT_OF_MEMORY"],
        ["ctxnew", "CUDA_ERROR_OUT_OF_MEMORY"],
        ["total", "CUDA_SUCCESS", "0"],
    ]
    assert lines[4] == ["ctx", "CUDA_SUCCESS"]
    assert lines[5][:2] == ["alloc", "CUDA_SUCCESS"]
