"""A test double of the ``pynvml`` module: the GPUs of a machine CI does not have.

It answers the calls the agent makes as nvidia-ml-py does on a real driver,
with the library's own types: errors are pynvml's ``NVMLError`` subclasses
(built from the same codes, so ``str()`` reads the same), memory and
utilization come back in pynvml's ctypes structures, UUIDs as ``str``.
NVML's rules are kept: nothing works before ``nvmlInit`` or after the last
``nvmlShutdown``; ``nvmlDeviceGetProcessUtilization`` returns the samples
newer than the timestamp it is given (CPU time in microseconds), only for
processes that were busy, and ``NVML_ERROR_NOT_FOUND`` when there is none.
Faults are set per test: no driver, a GPU that fell off the bus, a GPU
without utilization counters. MIG as NVML has it: a GPU without MIG answers
``NVML_ERROR_NOT_SUPPORTED`` to its MIG mode; one in MIG mode has up to 7 MIG
device slots, an empty slot answers ``NVML_ERROR_NOT_FOUND``, and a MIG
device's handle answers the UUID and memory queries of its own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pynvml

GIB = 1 << 30


@dataclass
class FakeDevice:
    """One GPU: its UUID and memory, and the processes busy on it (host pid -> SM percent)."""

    uuid: str
    memory_total: int = 80 * GIB
    memory_used: int = 0
    utilization: int = 0
    busy: dict[int, int] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)  # host pid -> bytes of compute processes
    lost: bool = False
    has_utilization: bool = True
    sample_age: float = 0.1  # seconds between the latest sample and the query
    name: str = "NVIDIA H100 80GB HBM3"
    compute_capability: tuple[int, int] = (9, 0)
    mig_mode: int | None = None  # NVML_DEVICE_MIG_ENABLE or _DISABLE; None: a GPU without MIG
    migs: list[FakeDevice | None] = field(default_factory=list)  # MIG devices by slot


MIG_SLOTS = 7  # nvmlDeviceGetMaxMigDeviceCount of an H100


class FakeNvml:
    """Stands in for the ``pynvml`` module; ``devices`` in NVML index order."""

    NVMLError = pynvml.NVMLError
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, devices: list[FakeDevice], driver_loaded: bool = True) -> None:
        self.devices = devices
        self.driver_loaded = driver_loaded
        self.inits = 0
        self._refcount = 0
        self.queries: list[str] = []

    def __getattr__(self, name: str) -> object:
        if name.startswith("NVMLError_"):  # the library's own error classes
            return getattr(pynvml, name)
        raise AttributeError(name)

    # --- library ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if not self.driver_loaded:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.inits += 1
        self._refcount += 1

    def nvmlShutdown(self) -> None:
        self._ready("nvmlShutdown")
        self._refcount -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._ready("nvmlDeviceGetCount")
        if not self.driver_loaded:  # unloaded under a running agent
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self._ready("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[index]

    # --- one device -------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str:
        return self._device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeDevice) -> tuple[int, int]:
        return self._device("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> pynvml.c_nvmlMemory_t:
        device = self._device("nvmlDeviceGetMemoryInfo", handle)
        memory = pynvml.c_nvmlMemory_t()
        memory.total, memory.used = device.memory_total, device.memory_used
        memory.free = device.memory_total - device.memory_used
        return memory

    def nvmlDeviceGetMigMode(self, handle: FakeDevice) -> list[int]:
        device = self._mig_capable("nvmlDeviceGetMigMode", handle)
        return [device.mig_mode, device.mig_mode]  # current and pending

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeDevice) -> int:
        self._mig_capable("nvmlDeviceGetMaxMigDeviceCount", handle)
        return MIG_SLOTS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeDevice, index: int) -> FakeDevice:
        device = self._mig_capable("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if device.mig_mode != pynvml.NVML_DEVICE_MIG_ENABLE or not 0 <= index < MIG_SLOTS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        mig = device.migs[index] if index < len(device.migs) else None
        if mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return mig

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> pynvml.c_nvmlUtilization_t:
        device = self._device("nvmlDeviceGetUtilizationRates", handle)
        if not device.has_utilization:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu, rates.memory = device.utilization, 0
        return rates

    def nvmlDeviceGetProcessUtilization(self, handle: FakeDevice, timeStamp: int) -> list:
        device = self._device("nvmlDeviceGetProcessUtilization", handle)
        if not device.has_utilization:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        stamp = int((time.time() - device.sample_age) * 1e6)
        samples = []
        for pid, percent in device.busy.items():
            if percent and stamp > timeStamp:
                sample = pynvml.c_nvmlProcessUtilizationSample_t()
                sample.pid, sample.timeStamp, sample.smUtil = pid, stamp, percent
                samples.append(sample)
        if not samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list:
        device = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        running = []
        for pid, size in device.held.items():  # as the library converts its structures
            process = pynvml.c_nvmlProcessInfo_t()
            process.pid, process.usedGpuMemory = pid, size
            running.append(pynvml.nvmlStructToFriendlyObject(process))
        return running

    # --- rules ------------------------------------------------------------------------------

    def _ready(self, call: str) -> None:
        self.queries.append(call)
        if self._refcount <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _mig_capable(self, call: str, handle: FakeDevice) -> FakeDevice:
        device = self._device(call, handle)
        if device.mig_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return device

    def _device(self, call: str, handle: FakeDevice) -> FakeDevice:
        self._ready(call)
        if handle.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle
