"""CUDA graphs' allocation nodes count against the limit; stream capture works in every mode."""

from __future__ import annotations

import pytest

from tests.shim.harness import CONTEXT, GIB, MIB, FakeGpu, info

MODES = ["global", "thread", "relaxed"]


def in_use(lines: list[list[str]]) -> int:
    free, total = info(lines)
    return total - free


@pytest.mark.parametrize("mode", MODES)
def test_an_allocation_captured_in_any_mode_is_charged_when_its_graph_is_launched(
    gpu: FakeGpu, mode: str
) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "gcapture", mode, "1G", "keep", "info", "glaunch", "0",
                      "info", "gmem")
    assert lines[2] == ["gcapture", "CUDA_SUCCESS", "0"]
    assert in_use(lines[:4]) == CONTEXT, "a capture allocates nothing yet"
    assert lines[4] == ["glaunch", "CUDA_SUCCESS"]
    assert in_use(lines) == CONTEXT + GIB
    assert lines[6] == ["gmem", "CUDA_SUCCESS", str(GIB)]


@pytest.mark.parametrize("mode", ["link", "getproc", "getproc-ptsz"])
def test_graphs_past_the_limit_fail_out_of_memory_and_the_driver_never_backs_them(
    gpu: FakeGpu, mode: str
) -> None:
    gpu.limit(2 * GIB)
    lines = gpu.lines("init", "ctx", "0", "gcapture", "relaxed", "1G", "keep",
                      "gcapture", "relaxed", "1G", "keep", "glaunch", "0", "glaunch", "1", "gmem",
                      "info", mode=mode)
    assert lines[4] == ["glaunch", "CUDA_SUCCESS"]
    assert lines[5] == ["glaunch", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert lines[6] == ["gmem", "CUDA_SUCCESS", str(GIB)]
    assert in_use(lines) == CONTEXT + GIB


def test_an_allocation_node_added_by_hand_is_charged_at_upload(gpu: FakeGpu) -> None:
    gpu.limit(2 * GIB)
    lines = gpu.lines("init", "ctx", "0", "gnode", "1G", "gnode", "1G", "gupload", "0",
                      "gupload", "1", "glaunch", "0", "info")
    assert [line[:2] for line in lines[2:7]] == [
        ["gnode", "CUDA_SUCCESS"],
        ["gnode", "CUDA_SUCCESS"],
        ["gupload", "CUDA_SUCCESS"],
        ["gupload", "CUDA_ERROR_OUT_OF_MEMORY"],
        ["glaunch", "CUDA_SUCCESS"],
    ]
    assert in_use(lines) == CONTEXT + GIB


def test_graphs_that_free_their_allocations_reuse_the_memory_and_all_run(gpu: FakeGpu) -> None:
    # Three graphs of 1 GiB each under a 2 GiB limit: the driver backs them with one GiB.
    gpu.limit(2 * GIB)
    words = ["init", "ctx", "0"]
    for _ in range(3):
        words += ["gcapture", "global", "1G", "free"]
    words += ["glaunch", "0", "glaunch", "1", "glaunch", "2", "glaunch", "0", "info", "gmem"]
    lines = gpu.lines(*words)
    assert [line[1] for line in lines[2:9]] == ["CUDA_SUCCESS"] * 7
    assert lines[10] == ["gmem", "CUDA_SUCCESS", str(GIB)]
    assert in_use(lines) == CONTEXT + GIB


def test_a_trim_gives_graph_memory_back_to_the_account(gpu: FakeGpu) -> None:
    gpu.limit(2 * GIB)
    lines = gpu.lines("init", "ctx", "0", "gcapture", "relaxed", "1G", "free", "glaunch", "0",
                      "free", "0", "info", "gtrim", "info")
    assert in_use(lines[:6]) == CONTEXT + GIB, "freed graph memory stays reserved"
    assert lines[6] == ["gtrim", "CUDA_SUCCESS"]
    assert in_use(lines) == CONTEXT


def test_a_trim_keeps_what_a_live_graph_allocation_holds(gpu: FakeGpu) -> None:
    gpu.limit(2 * GIB)
    lines = gpu.lines("init", "ctx", "0", "gcapture", "thread", "1G", "keep", "glaunch", "0",
                      "gtrim", "info", "gcapture", "thread", "1G", "keep", "glaunch", "1")
    assert in_use(lines[:6]) == CONTEXT + GIB, "a trim keeps what live allocations hold"
    assert lines[7] == ["glaunch", "CUDA_ERROR_OUT_OF_MEMORY"]


@pytest.mark.parametrize("mode", MODES)
def test_stream_ordered_allocations_in_a_capture_leave_it_valid(gpu: FakeGpu, mode: str) -> None:
    gpu.limit(4 * GIB)
    # A pool of the device's is in use already: its attribute queries are the unsafe calls.
    lines = gpu.lines("init", "ctx", "0", "async", "64M", "gcapture", mode, "512M", "free",
                      "glaunch", "1", "info")
    assert lines[3] == ["gcapture", "CUDA_SUCCESS", "1"]
    assert lines[4] == ["glaunch", "CUDA_SUCCESS"]


def test_without_the_shim_graphs_take_the_whole_device(gpu: FakeGpu) -> None:
    gpu.limit(2 * GIB)
    words = ["init", "ctx", "0"]
    for i in range(4):
        words += ["gcapture", "relaxed", "1G", "keep", "glaunch", str(i)]
    lines = gpu.lines(*words, "info", shim=False)
    assert [line for line in lines if line[0] == "glaunch"] == [["glaunch", "CUDA_SUCCESS"]] * 4
    assert in_use(lines) == CONTEXT + 4 * GIB


def test_a_captured_allocation_charges_nothing_to_the_stream_pool(gpu: FakeGpu) -> None:
    gpu.limit(1 * GIB)
    lines = gpu.lines("init", "ctx", "0", "gcapture", "relaxed", "768M", "keep", "async", "512M",
                      "info")
    assert lines[3][:2] == ["async", "CUDA_SUCCESS"]
    assert in_use(lines) == CONTEXT + 512 * MIB


@pytest.mark.parametrize("mode", MODES)
def test_allocations_and_memory_queries_leave_another_threads_capture_valid(
    gpu: FakeGpu, mode: str
) -> None:
    # The library's pool queries for this thread's allocations and memory figures are
    # made in relaxed mode: a global capture of another thread survives them.
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "async", "64M", "bgcapture", mode, "async", "64M",
                      "pool", "32M", "info", "nvml", "bgend")
    assert lines[3] == ["bgcapture", "CUDA_SUCCESS"]
    assert [line[:2] for line in lines[4:7]] == [
        ["async", "CUDA_SUCCESS"], ["pool", "CUDA_SUCCESS"], ["info", "CUDA_SUCCESS"]]
    assert lines[-1] == ["bgend", "CUDA_SUCCESS"]
