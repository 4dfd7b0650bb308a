"""One memory view: cuMemGetInfo, nvmlDeviceGetMemoryInfo(_v2) and the compute process list of a
limited device agree (inference engines profile memory by comparing them)."""

from __future__ import annotations

from tests.shim.harness import CONTEXT, GIB, MIB, FakeGpu, fake_uuid, info


def views(line: list[str]) -> dict[str, int]:
    """The figures of a probe "nvml" line, by name."""
    names = ("v1", "total", "free", "used", "v2", "total2", "reserved", "free2", "used2",
             "list", "processes", "listed", "own", "list_v1", "listed_v1")
    return dict(zip(names, map(int, line[3:]), strict=True))


def test_cuda_nvml_and_the_process_list_agree_in_a_limited_process(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "alloc", "1G", "async", "256M", "info", "nvml")
    free, total = info(lines)
    v = views(lines[5])
    assert (v["v1"], v["v2"], v["list"], v["list_v1"]) == (0, 0, 0, 0)
    assert total == v["total"] == v["total2"] == 4 * GIB
    assert free == v["free"] == v["free2"]
    assert v["used"] == v["used2"] == v["listed"] == v["listed_v1"] == total - free
    assert v["used"] == CONTEXT + GIB + 256 * MIB
    assert (v["processes"], v["own"]) == (1, 1)


def test_the_process_list_holds_every_process_of_the_container(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    with gpu.running("init", "ctx", "0", "alloc", "1G", "wait"):
        lines = gpu.lines("init", "ctx", "0", "nvml", "info")
    v = views(lines[2])
    assert v["processes"] == 2
    assert v["listed"] == v["used"] == 2 * CONTEXT + GIB == 4 * GIB - info(lines)[0]


def test_a_refused_device_lists_no_process(two_gpus: FakeGpu) -> None:
    two_gpus.limit(1 * GIB, devices=(fake_uuid(1),))
    with two_gpus.running("init", "ctx", "1", "wait"):
        lines = two_gpus.lines("nvml")
    assert [(views(line)["processes"], views(line)["listed"]) for line in lines] == [
        (0, 0), (1, CONTEXT)]


def test_without_a_limits_file_the_process_list_is_the_drivers(gpu: FakeGpu) -> None:
    with gpu.running("init", "ctx", "0", "alloc", "1G", "wait"):
        listed = views(gpu.lines("nvml")[0])
    assert (listed["processes"], listed["listed"], listed["total"]) == (1, CONTEXT + GIB, 8 * GIB)
