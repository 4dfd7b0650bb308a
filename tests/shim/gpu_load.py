"""The GPU load of the compute-share tests and benchmark (cshim/bench/pacing_load.cu): run, read;
and the GPU's busy time as its driver samples it."""

from __future__ import annotations

import importlib.util
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "cshim" / "build" / "gpu" / "pacing_load"
#: Time for the processes of one measurement to start (CUDA, cuBLAS) and warm up.
START_S = 2.0


@dataclass(frozen=True)
class Limit:
    """A vcuda-run core limit, and the account it shares (None: a private one)."""

    cores: int
    account: Path | None = None


@dataclass(frozen=True)
class Load:
    """One load process: a kind of kernel (matmul, elementwise), its streams, its limit."""

    kind: str
    streams: int = 1
    limit: Limit | None = None


@dataclass(frozen=True)
class Result:
    """What a load process measured: kernels a second, overall and over 2-second windows."""

    kernels: int
    seconds: float
    rate: float
    window_min: float
    window_max: float
    launched: int   # kernels launched, warm-up included
    log: str = ""   # the end of its stderr (the shim's log, at the level the caller set)


def cublas_library() -> Path | None:
    """This machine's libcublas: the CUDA toolkit's, else NVIDIA's wheels' (PyTorch brings them)."""
    roots = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64"]
    spec = importlib.util.find_spec("nvidia")
    if spec and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    for root in roots:
        found = sorted(root.glob("**/libcublas.so*"))
        if found:
            return found[0]
    return None


def environment() -> dict[str, str]:
    """The environment of a load process: the checkout on PYTHONPATH, cuBLAS found."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    library = cublas_library()
    if library:
        env["VCUDA_CUBLAS"] = str(library)
        env["LD_LIBRARY_PATH"] = f"{library.parent}:{env.get('LD_LIBRARY_PATH', '')}"
    return env


def command(load: Load, seconds: float, start_at: float) -> list[str]:
    """The command line of a load process that measures seconds from start_at."""
    program = [str(PROGRAM), load.kind, str(seconds), str(load.streams), f"{start_at:.3f}"]
    if load.limit is None:
        return program
    shared = ["--account", str(load.limit.account)] if load.limit.account else []
    return [sys.executable, "-m", "runtime_hook.run", "--memory", "16Gi", "--cores",
            str(load.limit.cores), *shared, "--", *program]


def parse(output: str, log: str) -> Result:
    """A load process's result from its output line and its log."""
    words = output.split()
    values = dict(zip(words[::2], words[1::2]))
    return Result(int(values["kernels"]), float(values["seconds"]), float(values["rate"]),
                  float(values["window_min"]), float(values["window_max"]), int(values["all"]),
                  log[-1500:])


def run_together(*loads: Load, seconds: float = 3.0) -> list[Result]:
    """Runs the loads at once, all measuring the same interval of seconds; their results."""
    start_at = time.time() + START_S
    processes = [
        subprocess.Popen(command(load, seconds, start_at), env=environment(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for load in loads
    ]
    results = []
    for load, process in zip(loads, processes):
        out, err = process.communicate(timeout=120)
        if process.returncode != 0:
            raise RuntimeError(f"{load} failed ({process.returncode}): {err.strip()[-2000:]}")
        results.append(parse(out, err))
    return results


def run(load: Load, seconds: float = 3.0) -> Result:
    """Runs one load alone."""
    return run_together(load, seconds=seconds)[0]


def busy_percent(start: float, end: float) -> float | None:
    """The share of [start, end] (time.time()) in which GPU 0 ran a kernel, in percent, as
    its driver samples it (NVML's GPU utilization): GPU time measured apart from the shim.
    None without samples."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        _, samples = pynvml.nvmlDeviceGetSamples(
            handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, int(start * 1e6))
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
    values = [s.sampleValue.uiVal for s in samples if start * 1e6 <= s.timeStamp <= end * 1e6]
    return statistics.mean(values) if values else None


#: The library's exit tally at the info level (VCUDA_LOG_LEVEL=info).
WAITED = re.compile(r"(\d+) waited for the bucket, ([\d.]+) s in all")


#: The compute share's targets on real workloads (docs/BENCHMARKS.md): a workload under its
#: share keeps >= UNDER of its unlimited rate; one over it gets its share +- BAND points of busy
#: time and >= OVER of its ideal rate (ideal_rate).
UNDER = 0.95
OVER = 0.9
BAND = 5


def ideal_rate(rate: float, busy: float | None, cores: int) -> float:
    """What a perfect limiter at cores% leaves a run of rate steps a second that kept the device
    busy% busy unlimited: all of it under the limit, else rate x cores / busy (the rate itself
    where NVML gave no figure)."""
    return rate * min(1.0, cores / busy) if busy else rate


def bucket_waits(log: str) -> tuple[int, float]:
    """The launches that waited for the bucket, and the seconds they waited in all, as the
    library's log at the info level tells them; (0, 0.0) where it told none."""
    found = WAITED.search(log)
    return (int(found[1]), float(found[2])) if found else (0, 0.0)


def processes_that_waited(waits: list[tuple[int, float]]) -> str:
    """'K of N[, LOW-HIGH s in all]': how many of N processes, each given by its bucket_waits,
    waited for the bucket, and the range of the seconds those waited."""
    waited = [seconds for launches, seconds in waits if launches]
    return f"{len(waited)} of {len(waits)}" + (
        f", {min(waited):.3f}-{max(waited):.3f} s in all" if waited else "")


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values measured (None: not measured); None if there are none."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def shown(percent: float | None) -> str:
    """A percentage as the benchmarks print it: one decimal, or '-' where NVML gave none."""
    return "-" if percent is None else f"{percent:.1f}"
