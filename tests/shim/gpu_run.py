"""Running programs under libvcuda.so on a real GPU, and measuring them from outside (NVML)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.shim.harness import GIB, REPO

#: The memory limit of the GPU tests.
LIMIT = 4 * GIB

# Fills the limit with 256 MiB tensors, each written with its own value by a kernel, then
# checks every one on the device; prints the limit seen, the count, the error that ended it
# and whether every tensor held its value.
TORCH_FILL = """
import sys, torch
free, total = torch.cuda.mem_get_info()
print("info", free, total, flush=True)
held, error = [], "none"
try:
    while len(held) < 64:
        block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        block.fill_(len(held) % 251)
        held.append(block)
except Exception as exc:
    error = type(exc).__name__
right = all(int(b[::4096].sum()) == (i % 251) * b[::4096].numel() for i, b in enumerate(held))
print("filled", len(held), error, right, flush=True)
sys.stdin.readline()
"""


def vcuda_run(*command: str, account: Path | None = None, cores: int = 100,
              virtual: str | None = None) -> list[str]:
    """The vcuda-run command line for command with the 4 GiB limit (and a core limit, and
    ``virtual`` of it in host memory)."""
    shared = ["--account", str(account)] if account else []
    host = ["--virtual-memory", virtual] if virtual else []
    return [sys.executable, "-m", "runtime_hook.run", "--memory", "4Gi", "--cores", str(cores),
            *shared, *host, "--", *command]


def environment(**extra: str) -> dict[str, str]:
    """This machine's environment (its real driver), with the shim's log on."""
    return dict(os.environ, PYTHONPATH=str(REPO), VCUDA_LOG_LEVEL="info", **extra)


@contextmanager
def started(command: list[str], **env: str) -> Iterator[subprocess.Popen[str]]:
    """command running with pipes on its standard streams; killed (stderr shown) at the end."""
    process = subprocess.Popen(
        command,
        env=environment(**env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.kill()
        _, err = process.communicate(timeout=60)
        print(f"--- stderr of {command[-1][:40]!r}:\n{err[-3000:]}")


def line(process: subprocess.Popen[str]) -> list[str]:
    """The next line the program prints (the probe's "# " lines of a fillwith skipped)."""
    assert process.stdout is not None
    text = "#"
    while text.startswith("#"):
        text = process.stdout.readline()
        assert text, "the program ended early"
    return text.split()


def _processes() -> dict[int, int]:
    """GPU 0's compute processes and the bytes each holds, as the driver reports them."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return {int(p.pid): int(p.usedGpuMemory or 0)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def process_memory(pid: int) -> int:
    """The GPU memory the driver says process pid holds, by NVML (outside the shim)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        held = _processes()
    finally:
        pynvml.nvmlShutdown()
    if pid not in held:
        raise AssertionError(f"NVML lists no process {pid}")
    return held[pid]


class Peak:
    """Samples, every 10 ms, the GPU memory of every process on GPU 0 (NVML, outside
    any library) and keeps the highest total: on a GPU machine that runs one test at a
    time, what the test's processes held together."""

    def __init__(self) -> None:
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        try:
            while not self._stop.wait(0.01):
                self.bytes = max(self.bytes, sum(_processes().values()))
        finally:
            pynvml.nvmlShutdown()

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
