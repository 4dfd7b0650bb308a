"""VMM memory (cuMemCreate, cuMemImportFromShareableHandle) is charged while a handle or a mapping
keeps it alive, as the driver keeps it; memory imported from another process is charged to the
importer at its mapping."""

from __future__ import annotations

from tests.shim.harness import CONTEXT, GIB, FakeGpu, fake_uuid, info

#: A process that creates 1 GiB it can export and exports it; its fourth line holds the
#: descriptor: ["vmmexport", result, pid, fd].
EXPORTER = ("init", "ctx", "0", "vmmfd", "1G", "0", "vmmexport", "0", "wait")


def used(lines: list[list[str]]) -> int:
    """What the last ``info`` says the container uses."""
    free, total = info(lines)
    return total - free


def test_memory_released_while_mapped_stays_charged_until_unmapped(gpu: FakeGpu) -> None:
    # The CUDA samples' idiom: release the handle right after mapping; the memory stays.
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "vmm", "1G", "0", "vmmmap", "0", "1G", "free", "0",
                      "info", "free", "1", "info")
    assert [line[:2] for line in lines[2:5]] == [
        ["vmm", "CUDA_SUCCESS"], ["vmmmap", "CUDA_SUCCESS"], ["free", "CUDA_SUCCESS"]]
    assert used(lines[:6]) == CONTEXT + GIB, "released but mapped: still held"
    assert lines[6] == ["free", "CUDA_SUCCESS"]
    assert used(lines) == CONTEXT, "unmapped too: given back"


def test_a_retained_handle_keeps_the_charge_until_its_last_release(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "vmm", "1G", "0", "vmmmap", "0", "1G", "vmmretain", "1",
                      "free", "0", "free", "1", "info", "free", "2", "info")
    assert lines[4] == ["vmmretain", "CUDA_SUCCESS", "2"]
    assert used(lines[:8]) == CONTEXT + GIB, "one reference is left"
    assert used(lines) == CONTEXT


def test_unmapping_two_mappings_in_one_call_gives_back_both(gpu: FakeGpu) -> None:
    gpu.limit(4 * GIB)
    lines = gpu.lines("init", "ctx", "0", "vmm", "1G", "0", "vmm", "1G", "0", "vmmmap2", "0", "1",
                      "1G", "free", "0", "free", "1", "info", "free", "2", "info")
    assert lines[4][:2] == ["vmmmap2", "CUDA_SUCCESS"]
    assert used(lines[:8]) == CONTEXT + 2 * GIB
    assert lines[8] == ["free", "CUDA_SUCCESS"]
    assert used(lines) == CONTEXT


def test_memory_another_process_exports_is_charged_to_the_importer_once_mapped(
    gpu: FakeGpu,
) -> None:
    gpu.limit(4 * GIB)
    with gpu.running(*EXPORTER) as exporter:
        _, result, pid, fd = exporter.lines[3]
        assert result == "CUDA_SUCCESS"
        lines = gpu.lines("init", "ctx", "0", "vmmimport", pid, fd, "info", "vmmmap", "0", "1G",
                          "info", "free", "1", "info", "free", "0", "info")
    assert lines[2] == ["vmmimport", "CUDA_SUCCESS", "0"]
    # Two contexts and the exporter's GiB; the import alone tells no size.
    assert used(lines[:4]) == 2 * CONTEXT + GIB
    assert lines[4] == ["vmmmap", "CUDA_SUCCESS", "1"]
    assert used(lines[:6]) == 2 * CONTEXT + 2 * GIB, "mapped: charged here too"
    assert used(lines[:8]) == 2 * CONTEXT + 2 * GIB, "unmapped, the handle still holds it"
    assert lines[8] == ["free", "CUDA_SUCCESS"]
    assert used(lines) == 2 * CONTEXT + GIB, "released: given back"


def test_an_imported_mapping_that_does_not_fit_is_refused_and_not_mapped(gpu: FakeGpu) -> None:
    gpu.limit(2 * GIB)
    with gpu.running(*EXPORTER) as exporter:
        pid, fd = exporter.lines[3][2:]
        lines = gpu.lines("init", "ctx", "0", "vmmimport", pid, fd, "vmmmap", "0", "1G", "info",
                          "vmmmap", "0", "512M", "free", "1", "free", "0", "info")
    assert lines[3] == ["vmmmap", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert used(lines[:5]) == 2 * CONTEXT + GIB
    # Nothing of the refused mapping is left: half of it fits, in the same range of addresses.
    assert lines[5] == ["vmmmap", "CUDA_SUCCESS", "1"]
    assert lines[6:8] == [["free", "CUDA_SUCCESS"], ["free", "CUDA_SUCCESS"]]
    assert used(lines) == 2 * CONTEXT + GIB


def test_memory_imported_from_a_device_the_limits_do_not_list_cannot_be_mapped(
    two_gpus: FakeGpu,
) -> None:
    two_gpus.limit(4 * GIB, devices=(fake_uuid(0),))
    exporter_words = ("init", "ctx", "1", "vmmfd", "1G", "1", "vmmexport", "0", "wait")
    with two_gpus.running(*exporter_words, shim=False) as exporter:
        pid, fd = exporter.lines[3][2:]
        lines = two_gpus.lines("init", "ctx", "0", "vmmimport", pid, fd, "vmmmap", "0", "1G")
    assert lines[2] == ["vmmimport", "CUDA_SUCCESS", "0"]
    assert lines[3] == ["vmmmap", "CUDA_ERROR_OUT_OF_MEMORY"]
