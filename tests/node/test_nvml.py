"""The agent's NVML layer against a pynvml double, and against the real pynvml without a driver."""

from __future__ import annotations

import logging
import time

import pytest

from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import UTILIZATION_WINDOW, GpuState, Nvml, NvmlError
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml


@pytest.fixture
def problems() -> Problems:
    return Problems(logging.getLogger("test"), "test")


def test_gpus_lists_each_gpu_with_index_uuid_memory_and_utilization(problems: Problems) -> None:
    lib = FakeNvml([FakeDevice("GPU-a", 80 * GIB, 3 * GIB, 40),
                    FakeDevice("GPU-b", 40 * GIB, 0, 0, has_utilization=False)])
    assert Nvml(lib).gpus(problems) == [
        GpuState(0, "GPU-a", 80 * GIB, 3 * GIB, 40),
        GpuState(1, "GPU-b", 40 * GIB, 0, None),
    ]
    assert lib.inits == 1


def test_a_gpu_that_fell_off_the_bus_is_left_out_and_reported(problems: Problems) -> None:
    lib = FakeNvml([FakeDevice("GPU-a", lost=True), FakeDevice("GPU-b")])
    assert [gpu.uuid for gpu in Nvml(lib).gpus(problems)] == ["GPU-b"]
    assert problems.counts == {"nvml": 1}


def test_without_a_driver_nvml_fails_and_starts_again_once_it_is_back(problems: Problems) -> None:
    lib = FakeNvml([FakeDevice("GPU-a")], driver_loaded=False)
    nvml = Nvml(lib)
    with pytest.raises(NvmlError, match="NVML cannot start: Driver Not Loaded"):
        nvml.gpus(problems)
    lib.driver_loaded = True
    assert [gpu.uuid for gpu in nvml.gpus(problems)] == ["GPU-a"]
    lib.driver_loaded = False  # unloaded under the running agent: NVML is started afresh
    with pytest.raises(NvmlError, match="NVML cannot count the GPUs: Driver Not Loaded"):
        nvml.gpus(problems)
    lib.driver_loaded = True
    assert len(nvml.gpus(problems)) == 1 and lib.inits == 2


def test_the_real_pynvml_on_a_machine_without_a_driver_says_so(problems: Problems) -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvmlError, match=r"NVML cannot start: (NVML Shared Library Not Found|"
                                        r"Driver Not Loaded)"):
        Nvml().gpus(problems)


def test_process_utilization_is_each_busy_process_latest_sample(problems: Problems) -> None:
    device = FakeDevice("GPU-a", busy={4242: 35, 4343: 0, 4444: 60})
    nvml = Nvml(FakeNvml([device]))
    assert nvml.process_utilization(0) == {4242: 35, 4444: 60}
    device.busy = {}
    assert nvml.process_utilization(0) == {}  # NVML's NOT_FOUND: nobody was busy


def test_samples_older_than_the_window_do_not_count(problems: Problems) -> None:
    device = FakeDevice("GPU-a", busy={4242: 35}, sample_age=UTILIZATION_WINDOW + 1)
    nvml = Nvml(FakeNvml([device]))
    assert nvml.process_utilization(0) == {}
    assert nvml.process_utilization(0, now=time.time() - 1.5) == {4242: 35}


def test_process_utilization_of_a_gpu_without_counters_is_an_nvml_error() -> None:
    nvml = Nvml(FakeNvml([FakeDevice("GPU-a", has_utilization=False)]))
    with pytest.raises(NvmlError, match="per-process utilization of GPU 0: Not Supported"):
        nvml.process_utilization(0)


def test_close_stops_nvml_and_the_next_call_starts_it_again(problems: Problems) -> None:
    lib = FakeNvml([FakeDevice("GPU-a")])
    nvml = Nvml(lib)
    nvml.gpus(problems)
    nvml.close()
    with pytest.raises(lib.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()
    assert len(nvml.gpus(problems)) == 1 and lib.inits == 2
