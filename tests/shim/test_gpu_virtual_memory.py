"""Virtual device memory on a real GPU: 4 GiB limits of which 2 GiB may live in host memory."""

from __future__ import annotations

import sys

import pytest

from tests.shim.gpu_run import line, process_memory, started
from tests.shim.harness import GIB, MIB

pytestmark = pytest.mark.gpu

BLOCK = 256 * MIB

# Fills the limit with 256 MiB tensors, each written with its own value by a kernel, then
# checks every one on the device: tensors in host memory must compute as those on the device.
TORCH_VIRTUAL_FILL = """
import sys, torch
free, total = torch.cuda.mem_get_info()
print("info", free, total, flush=True)
held, error = [], "none"
try:
    while len(held) < 64:
        block = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        block.fill_(len(held) % 251)
        held.append(block)
except torch.OutOfMemoryError:
    error = "OutOfMemoryError"
right = all(int(b[::4096].sum()) == (i % 251) * b[::4096].numel() for i, b in enumerate(held))
print("filled", len(held), error, right, flush=True)
sys.stdin.readline()
"""


def _vcuda_run(*args: str) -> list[str]:
    return [sys.executable, "-m", "runtime_hook.run", *args]


def test_torch_fills_the_whole_limit_with_half_of_it_in_host_memory() -> None:
    command = _vcuda_run("--memory", "4Gi", "--virtual-memory", "2Gi", "--",
                         sys.executable, "-c", TORCH_VIRTUAL_FILL)
    with started(command) as process:
        info, filled = line(process), line(process)
        on_device = process_memory(process.pid)
        print(f"{info} {filled} device-held={on_device}")
        assert info[0] == "info" and int(info[2]) == 4 * GIB
        assert filled[0] == "filled" and filled[2:] == ["OutOfMemoryError", "True"]
        assert 3.25 * GIB <= int(filled[1]) * BLOCK <= 4 * GIB
        # The device holds its part only (the context included); the rest is in host memory.
        assert on_device <= 2 * GIB


def test_without_virtual_memory_the_same_fill_stays_on_the_device() -> None:
    command = _vcuda_run("--memory", "4Gi", "--", sys.executable, "-c", TORCH_VIRTUAL_FILL)
    with started(command) as process:
        info, filled = line(process), line(process)
        on_device = process_memory(process.pid)
        print(f"{info} {filled} device-held={on_device}")
        assert filled[2:] == ["OutOfMemoryError", "True"]
        assert on_device > 3.25 * GIB
