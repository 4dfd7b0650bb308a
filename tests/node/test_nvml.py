"""The agent's NVML layer against a pynvml double, and against the real pynvml without a driver."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pynvml
import pytest

from runtime_hook.contract import Gpu
from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import UTILIZATION_WINDOW, GpuState, Nvml, NvmlError
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml
from tests.shim.harness import BUILD, REPO

FAKE_NVML = BUILD / "tests" / "libnvidia-ml.so.1"


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


def test_mig_devices_are_listed_with_their_gpus_index_and_their_own_memory(
    problems: Problems,
) -> None:
    first, second = FakeDevice("MIG-1", 10 * GIB), FakeDevice("MIG-2", 20 * GIB)
    lib = FakeNvml([
        FakeDevice("GPU-mig", 80 * GIB, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
                   migs=[first, None, second]),  # slot 1 empty
        FakeDevice("GPU-whole", 80 * GIB, mig_mode=pynvml.NVML_DEVICE_MIG_DISABLE),
        FakeDevice("GPU-old", 16 * GIB),  # no MIG at all
    ])
    nvml = Nvml(lib)
    assert nvml.mig_devices(nvml.gpus(problems), problems) == [
        Gpu("MIG-1", 0, 10 * GIB), Gpu("MIG-2", 0, 20 * GIB)]
    assert not problems.counts


def test_a_gpu_whose_mig_devices_cannot_be_read_gives_none_and_is_reported(
    problems: Problems,
) -> None:
    broken = FakeDevice("GPU-mig", 80 * GIB, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
                        migs=[FakeDevice("MIG-1", 10 * GIB, lost=True)])
    nvml = Nvml(FakeNvml([broken]))
    assert nvml.mig_devices(nvml.gpus(problems), problems) == []
    assert problems.counts["nvml"] == 1


def test_a_gpu_that_fell_off_the_bus_is_left_out_and_reported(problems: Problems) -> None:
    lib = FakeNvml([FakeDevice("GPU-a", lost=True), FakeDevice("GPU-b")])
    assert [gpu.uuid for gpu in Nvml(lib).gpus(problems)] == ["GPU-b"]
    assert problems.counts == {"nvml": 1}


def test_without_a_driver_nvml_fails_and_starts_again_once_it_is_back(problems: Problems) -> None:
    lib = FakeNvml([FakeDevice("GPU-a")], driver_loaded=False)
    nvml = Nvml(lib)
    with pytest.raises(NvmlError, match=r"NVML cannot start: the NVIDIA driver is not loaded "
                                        r"\(NVML error 9\)"):
        nvml.gpus(problems)
    lib.driver_loaded = True
    assert [gpu.uuid for gpu in nvml.gpus(problems)] == ["GPU-a"]
    lib.driver_loaded = False  # unloaded under the running agent: NVML is started afresh
    with pytest.raises(NvmlError, match=r"NVML cannot count the GPUs: the NVIDIA driver is not "
                                        r"loaded \(NVML error 9\)"):
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
    with pytest.raises(NvmlError, match=r"NVML cannot start: (libnvidia-ml\.so\.1 is not "
                                        r"installed \(NVML error 12\)|the NVIDIA driver is "
                                        r"not loaded \(NVML error 9\))"):
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
    with pytest.raises(NvmlError, match=r"per-process utilization of GPU 0: not supported by "
                                        r"this GPU \(NVML error 3\)"):
        nvml.process_utilization(0)


def test_close_stops_nvml_and_the_next_call_starts_it_again(problems: Problems) -> None:
    lib = FakeNvml([FakeDevice("GPU-a")])
    nvml = Nvml(lib)
    nvml.gpus(problems)
    nvml.close()
    with pytest.raises(lib.NVMLError_Uninitialized):
        lib.nvmlDeviceGetCount()
    assert len(nvml.gpus(problems)) == 1 and lib.inits == 2


_PROBE = """
import logging, sys
from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import Nvml, NvmlError
try:
    print(Nvml(host_root=sys.argv[1] or None).process_memory(0))
except NvmlError as exc:
    print(exc)
"""


def _probe(host_root: str, gpu_state: Path | str) -> str:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
           "VCUDA_FAKE_STATE": str(gpu_state), "VCUDA_FAKE_GPUS": "16384,16384"}
    done = subprocess.run([sys.executable, "-c", _PROBE, host_root], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def _node_with_nvml(tmp_path: Path) -> Path:
    """A node whose driver library is a link, as drivers install it, to an absolute path."""
    host = tmp_path / "host"
    (host / "usr/lib64").mkdir(parents=True)
    shutil.copy(FAKE_NVML, host / "usr/lib64/libnvidia-ml.so.580.1")
    (host / "usr/lib64/libnvidia-ml.so.1").symlink_to("/usr/lib64/libnvidia-ml.so.580.1")
    return host


def test_the_agent_loads_the_nodes_nvml_when_its_container_has_none(
    shim_build: None, tmp_path: Path
) -> None:
    host = _node_with_nvml(tmp_path)
    assert _probe(str(host), tmp_path / "gpu") == "{}"  # NVML answers: no process on GPU 0


def test_without_nvml_here_or_on_the_node_the_agent_says_where_it_looked(tmp_path: Path) -> None:
    message = _probe(str(tmp_path), tmp_path / "gpu")
    assert message.startswith("NVML cannot start: libnvidia-ml.so.1 is neither in this container "
                              "nor in the node's /usr/lib/x86_64-linux-gnu")
    assert message.endswith(": install the NVIDIA driver")


def test_the_nodes_nvml_without_the_gpus_device_files_says_to_run_under_nvidias_runtime(
    shim_build: None, tmp_path: Path
) -> None:
    # The double's state file stands for the GPUs' device files: here it cannot be opened,
    # as /dev/nvidiactl cannot in a container NVIDIA's runtime did not start.
    message = _probe(str(_node_with_nvml(tmp_path)), "/proc/no-such-device")
    assert message == ("NVML cannot start: NVML did not start (NVML error 1): this container did "
                       "not get the GPUs from NVIDIA's runtime; run it under that runtime (the "
                       "node's default runtime, or runtimeClassName: nvidia), or privileged")
