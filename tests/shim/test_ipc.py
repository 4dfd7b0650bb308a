"""Memory another process exports (CUDA IPC) is charged to the process that maps it."""

from __future__ import annotations

from tests.shim.harness import CONTEXT, GIB, FakeGpu, info

#: A process that exports 1 GiB; its fourth line holds the handle.
EXPORTER = ("init", "ctx", "0", "alloc", "1G", "ipcexport", "0", "wait")


def test_imported_memory_counts_against_the_importers_limit(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    with gpu.running(*EXPORTER) as exporter:
        handle = exporter.lines[3]
        assert handle[:2] == ["ipcexport", "CUDA_SUCCESS"]
        lines = gpu.lines("init", "ctx", "0", "ipcopen", handle[2], "info", "free", "0", "info")
    assert lines[2][:2] == ["ipcopen", "CUDA_SUCCESS"]
    free, total = info(lines[:4])
    # Two contexts, the exporter's GiB and the GiB mapped here.
    assert total - free == 2 * CONTEXT + 2 * GIB
    assert lines[4] == ["free", "CUDA_SUCCESS"]
    free, total = info(lines)
    assert total - free == 2 * CONTEXT + GIB, "closing the mapping gives the charge back"


def test_imported_memory_that_does_not_fit_is_refused_and_unmapped(gpu: FakeGpu) -> None:
    gpu.limit(2 * GIB)
    with gpu.running(*EXPORTER) as exporter:
        lines = gpu.lines("init", "ctx", "0", "ipcopen", exporter.lines[3][2], "info")
    assert lines[2] == ["ipcopen", "CUDA_ERROR_OUT_OF_MEMORY"]
    free, total = info(lines)
    assert total - free == 2 * CONTEXT + GIB
