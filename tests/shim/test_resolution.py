"""Every way to the driver leads to the wrappers, version for version; nothing else changes."""

from __future__ import annotations

import subprocess

import pytest

from tests.shim.harness import LIBRARY, TESTS, FakeGpu


def resolutions(gpu: FakeGpu, shim: bool, mode: str = "getproc") -> dict[tuple[str, ...], list]:
    """(name, version, flags) -> [result, library, symbol] as cuGetProcAddress answers."""
    lines = gpu.lines("resolve", mode=mode, shim=shim)
    return {tuple(line[1:4]): line[4:] for line in lines}


def wrapped(gpu: FakeGpu) -> set[str]:
    return {line[1] for line in gpu.lines("wrapped")}


@pytest.mark.parametrize("mode", ["getproc", "link"])
def test_cuGetProcAddress_hands_out_the_wrapper_of_exactly_the_version_the_driver_chose(
    gpu: FakeGpu, mode: str
) -> None:
    # A core limit: kernel launches are wrapped too.
    gpu.limit(1 << 30, cores=50)
    driver = resolutions(gpu, shim=False, mode=mode)
    shimmed = resolutions(gpu, shim=True, mode=mode)
    names = wrapped(gpu)
    assert driver.keys() == shimmed.keys()
    for key, (result, library, symbol) in driver.items():
        expected_library = "libvcuda.so" if symbol in names else library
        assert shimmed[key] == [result, expected_library, symbol], key
    # The table covers old and new versions, both stream flavours, and refusals.
    assert {"cuMemAlloc_v2", "cuMemAllocAsync_ptsz", "cuCtxCreate_v2", "cuCtxCreate_v4",
            "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuGraphLaunch_ptsz",
            # Every way a capture begins or ends: launches ask about capture only then.
            "cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2",
            "cuStreamBeginCapture_v2_ptsz", "cuStreamEndCapture", "cuStreamEndCapture_ptsz"} <= {
        symbol for _, library, symbol in shimmed.values() if library == "libvcuda.so"
    }
    assert ["CUDA_ERROR_NOT_FOUND", "-", "-"] in shimmed.values()


def test_each_version_gets_its_own_wrapper_and_a_version_not_wrapped_the_driver_itself(
    gpu: FakeGpu,
) -> None:
    gpu.limit(1 << 30)
    resolved = resolutions(gpu, shim=True)
    # The CUDA runtime asks for the original release at 7.0, newer code for _v2.
    assert resolved[("cuDevicePrimaryCtxRelease", "7000", "0")][1:] == [
        "libvcuda.so",
        "cuDevicePrimaryCtxRelease",
    ]
    assert resolved[("cuDevicePrimaryCtxRelease", "11000", "0")][1:] == [
        "libvcuda.so",
        "cuDevicePrimaryCtxRelease_v2",
    ]
    # Before 3.2, 32-bit sizes: not wrapped, handed out as the driver gives it.
    assert resolved[("cuMemGetInfo", "2000", "0")][1:] == ["libcuda.so.1", "cuMemGetInfo"]
    assert resolved[("cuMemGetInfo", "3020", "0")][1:] == ["libvcuda.so", "cuMemGetInfo_v2"]


LAUNCHES = ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel")


@pytest.mark.parametrize("cores", [100, None], ids=["cores=100", "no-cores-key"])
def test_without_a_core_limit_launches_are_the_drivers_own_in_every_flavour(
    gpu: FakeGpu, cores: int | None
) -> None:
    path = gpu.limit(1 << 30)
    if cores is None:
        path.write_text("".join(line for line in path.read_text().splitlines(True)
                                if not line.startswith("cores=")))
    launches = {k: v for k, v in resolutions(gpu, shim=True).items() if k[0] in LAUNCHES}
    assert {v[1] for v in launches.values() if v[0] == "CUDA_SUCCESS"} == {"libcuda.so.1"}
    assert {"cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchCooperativeKernel_ptsz"} <= {
        v[2] for v in launches.values()}


def test_graph_launches_are_wrapped_under_a_memory_limit_alone(gpu: FakeGpu) -> None:
    # A graph's first launch backs its allocation nodes: it is charged like an allocation.
    gpu.limit(1 << 30)
    launches = {k: v for k, v in resolutions(gpu, shim=True).items() if k[0] == "cuGraphLaunch"}
    assert {v[1] for v in launches.values() if v[0] == "CUDA_SUCCESS"} == {"libvcuda.so"}


def test_without_a_limits_file_nothing_is_wrapped(gpu: FakeGpu) -> None:
    assert resolutions(gpu, shim=True) == resolutions(gpu, shim=False)


def test_the_library_exports_exactly_the_intercepted_symbols_and_dlsym(gpu: FakeGpu) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(LIBRARY)], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines()}
    assert exported == wrapped(gpu) | {"dlsym"}


def test_interposers_that_use_dlsym_rtld_next_still_find_the_next_definition(
    gpu: FakeGpu,
) -> None:
    result = subprocess.run(
        [str(TESTS / "nexthook_prog")],
        env=dict(
            gpu.env,
            LD_PRELOAD=f"{LIBRARY} {TESTS / 'libnexthook.so'}",
            VCUDA_NEXTHOOK_PROBE="value",
        ),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert result.stdout == "hooked:value\n"
