"""The node's GPUs through NVML (``pynvml``): which there are, their memory, who uses them.

NVML is started on first use and again after it failed (a driver that is
being upgraded, a node without one), so the agent keeps running meanwhile.
A GPU whose queries fail is left out and reported; the others still count.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from typing import Any, NamedTuple

from runtime_hook.contract import Gpu
from runtime_hook.hook_errors import NodeError
from runtime_hook.node.host_root import host_path
from runtime_hook.node.logs import Problems

# How old a process's latest utilization sample may be and still count as now.
UTILIZATION_WINDOW = 2.0
NVML_LIBRARY = "libnvidia-ml.so.1"
# Where drivers put NVML on the node: distributions' library directories, the GPU
# Operator's driver container root, GKE's install directories.
HOST_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu", "/run/nvidia/driver/usr/lib64",
    "/usr/local/nvidia/lib64", "/home/kubernetes/bin/nvidia/lib64",
)


class NvmlError(NodeError, RuntimeError):
    """NVML cannot be used at the moment; the message says why."""

    fix = "check the NVIDIA driver on this node (nvidia-smi)"


# NVML's return codes (its ABI, fixed) in vcuda's words, so that what the agent logs and
# raises does not change with the wording of a pynvml release.
_REASONS = {
    1: "NVML did not start", 2: "an argument NVML refused", 3: "not supported by this GPU",
    4: "no permission", 6: "not found", 9: "the NVIDIA driver is not loaded",
    10: "NVML timed out", 12: f"{NVML_LIBRARY} is not installed",
    13: "a function this driver's NVML lacks", 14: "the GPU's InfoROM is corrupted",
    15: "the GPU has fallen off the bus", 16: "the GPU needs a reset",
    18: f"the driver and {NVML_LIBRARY} are of different versions", 20: "NVML is out of memory",
    21: "no data yet",
}


def _reason(error: Exception) -> str:
    """What an NVML error says, in vcuda's words, with NVML's code."""
    code = getattr(error, "value", None)
    reason = _REASONS.get(code, "an NVML error") if isinstance(code, int) else "an NVML error"
    return f"{reason} (NVML error {code})"


class GpuState(NamedTuple):
    """One GPU now: its NVML index and UUID, memory in bytes, and utilization in percent
    (None where the GPU does not report it)."""

    index: int  # type: ignore[assignment]  # NVML's word; hides tuple.index, unused here
    uuid: str
    memory_total: int
    memory_used: int
    utilization: int | None


class Nvml:
    """A thread-safe handle on NVML; ``lib`` is the ``pynvml`` module (or a test double of it)."""

    def __init__(self, lib: Any = None, host_root: str | None = None) -> None:
        """``host_root``: where the node's root is mounted; NVML is loaded from there when the
        container has none (nvidia is not the runtime that started it), which works where
        the container may open the GPUs' device files anyway (privileged)."""
        self._lib = lib
        self._host_root = host_root
        self._lock = threading.Lock()
        self._started = False

    def gpus(self, problems: Problems) -> list[GpuState]:
        """Every GPU NVML can read, by index; raise NvmlError when NVML itself fails."""
        with self._lock:
            lib = self._start()
            try:
                count = lib.nvmlDeviceGetCount()
            except lib.NVMLError as exc:
                self._stop()
                raise NvmlError(f"NVML cannot count the GPUs: {_reason(exc)}") from None
            found = []
            for index in range(count):
                try:
                    found.append(self._gpu(lib, index))
                except lib.NVMLError as exc:
                    problems.report("nvml", f"GPU {index}", f"NVML: {_reason(exc)}")
            return found

    def mig_devices(self, gpus: list[GpuState], problems: Problems) -> list[Gpu]:
        """The MIG devices of those of ``gpus`` in MIG mode: their UUID (``MIG-...``), the
        index of their GPU and their own memory in bytes. A GPU whose MIG devices cannot be
        read is reported and gives none; NVML failing raises NvmlError."""
        found = []
        with self._lock:
            lib = self._start()
            for gpu in gpus:
                try:
                    found += self._migs(lib, gpu.index)
                except lib.NVMLError as exc:
                    problems.report("nvml", f"MIG devices of GPU {gpu.index}",
                                    f"NVML: {_reason(exc)}")
        return found

    @staticmethod
    def _migs(lib: Any, index: int) -> list[Gpu]:
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        try:
            current, _ = lib.nvmlDeviceGetMigMode(handle)
        except lib.NVMLError_NotSupported:
            return []  # a GPU without MIG
        if current != lib.NVML_DEVICE_MIG_ENABLE:
            return []
        migs = []
        for slot in range(lib.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib.NVMLError_NotFound:
                continue  # no instance in this slot
            uuid = _text(lib.nvmlDeviceGetUUID(mig))
            migs.append(Gpu(uuid, index, lib.nvmlDeviceGetMemoryInfo(mig).total))
        return migs

    def model(self, index: int) -> tuple[str, tuple[int, int]]:
        """GPU ``index``'s product name and CUDA compute capability (major, minor)."""
        with self._lock:
            lib = self._start()
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                name = lib.nvmlDeviceGetName(handle)
                major, minor = lib.nvmlDeviceGetCudaComputeCapability(handle)
            except lib.NVMLError as exc:
                raise NvmlError(f"NVML cannot describe GPU {index}: {_reason(exc)}") from None
        return _text(name), (int(major), int(minor))

    def process_utilization(self, index: int, now: float | None = None) -> dict[int, int]:
        """SM utilization in percent of each process busy on GPU ``index``, by host pid.

        Each process's latest NVML sample from the last ``UTILIZATION_WINDOW``
        seconds; NVML only has samples of processes that were busy.
        """
        since = int(((time.time() if now is None else now) - UTILIZATION_WINDOW) * 1e6)
        with self._lock:
            lib = self._start()
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                samples = lib.nvmlDeviceGetProcessUtilization(handle, since)
            except lib.NVMLError_NotFound:
                return {}  # no process was busy
            except lib.NVMLError as exc:
                raise NvmlError(
                    f"NVML per-process utilization of GPU {index}: {_reason(exc)}") from None
        latest: dict[int, tuple[int, int]] = {}
        for sample in samples:
            if sample.timeStamp > latest.get(sample.pid, (-1, 0))[0]:
                latest[sample.pid] = (sample.timeStamp, sample.smUtil)
        return {pid: util for pid, (_, util) in latest.items()}

    def process_memory(self, index: int) -> dict[int, int]:
        """GPU memory in bytes that each compute process holds on GPU ``index``, by host pid.

        The driver's own accounting, which nothing in a container can change;
        it counts each process's CUDA context too. Processes whose figure NVML
        does not have (``usedGpuMemory`` None) count 0.
        """
        with self._lock:
            lib = self._start()
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                running = lib.nvmlDeviceGetComputeRunningProcesses(handle)
            except lib.NVMLError as exc:
                raise NvmlError(f"NVML compute processes of GPU {index}: {_reason(exc)}") from None
        held: dict[int, int] = {}
        for process in running:
            held[process.pid] = held.get(process.pid, 0) + (process.usedGpuMemory or 0)
        return held

    def close(self) -> None:
        """Stop NVML if it was started."""
        with self._lock:
            self._stop()

    def _start(self) -> Any:
        if self._lib is None:
            try:
                import pynvml
            except ImportError:
                raise NvmlError("pynvml is not installed (pip install nvidia-ml-py)") from None
            self._lib = pynvml
        lib = self._lib
        if not self._started:
            from_host = False
            try:
                try:
                    lib.nvmlInit()
                except lib.NVMLError_LibraryNotFound:
                    if not self._host_root or not _load_from_host(self._host_root):
                        raise
                    from_host = True
                    lib.nvmlInit()  # pynvml's dlopen by soname now finds the node's library
            except lib.NVMLError_LibraryNotFound as exc:
                if not self._host_root:
                    raise NvmlError(f"NVML cannot start: {_reason(exc)}") from None
                raise NvmlError(
                    f"NVML cannot start: {NVML_LIBRARY} is neither in this container nor in the "
                    f"node's {', '.join(HOST_LIBRARY_DIRS)}: install the NVIDIA driver") from None
            except lib.NVMLError as exc:
                if from_host:  # no NVIDIA runtime gave this container the GPUs
                    raise NvmlError(
                        f"NVML cannot start: {_reason(exc)}: this container did not get the "
                        "GPUs from NVIDIA's runtime; run it under that runtime (the node's default "
                        "runtime, or runtimeClassName: nvidia), or privileged") from None
                raise NvmlError(f"NVML cannot start: {_reason(exc)}") from None
            self._started = True
        return lib

    def _stop(self) -> None:
        if self._started:
            self._started = False
            with contextlib.suppress(self._lib.NVMLError):  # it failed: restarting it is the fix
                self._lib.nvmlShutdown()

    @staticmethod
    def _gpu(lib: Any, index: int) -> GpuState:
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(lib.nvmlDeviceGetUUID(handle))
        memory = lib.nvmlDeviceGetMemoryInfo(handle)
        try:
            utilization: int | None = lib.nvmlDeviceGetUtilizationRates(handle).gpu
        except lib.NVMLError_NotSupported:
            utilization = None
        return GpuState(index, uuid, memory.total, memory.used, utilization)


def _text(value: str | bytes) -> str:
    """A string NVML answered: nvidia-ml-py before 11.515 gave bytes."""
    return value.decode() if isinstance(value, bytes) else value


def _load_from_host(host_root: str) -> bool:
    """Load the node's NVML into this process; True when one was found and loaded.

    Loaded globally under its soname, so that ``pynvml``'s own
    ``dlopen("libnvidia-ml.so.1")`` gets this library rather than searching.
    """
    for directory in HOST_LIBRARY_DIRS:
        path = _in_root(host_root, f"{directory}/{NVML_LIBRARY}")
        if path is None:
            continue
        with contextlib.suppress(OSError):
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            return True
    return False


def _in_root(host_root: str, node_path: str) -> str | None:
    """``node_path`` of the node as a path here if it is a file, links taken inside
    ``host_root``."""
    with contextlib.suppress(OSError):  # a loop of links
        path = host_path(host_root, node_path)
        if os.path.isfile(path):
            return path
    return None
