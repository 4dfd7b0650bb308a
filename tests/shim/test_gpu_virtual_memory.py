"""Virtual device memory on a real GPU: 4 GiB limits of which 2 GiB may live in host memory."""

from __future__ import annotations

import sys

import pytest

from tests.shim.gpu_run import TORCH_FILL, line, process_memory, started, vcuda_run
from tests.shim.harness import GIB, MIB

pytestmark = pytest.mark.gpu

BLOCK = 256 * MIB


def test_torch_fills_the_whole_limit_with_half_of_it_in_host_memory() -> None:
    command = vcuda_run(sys.executable, "-c", TORCH_FILL, virtual="2Gi")
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
    command = vcuda_run(sys.executable, "-c", TORCH_FILL)
    with started(command) as process:
        info, filled = line(process), line(process)
        on_device = process_memory(process.pid)
        print(f"{info} {filled} device-held={on_device}")
        assert filled[2:] == ["OutOfMemoryError", "True"]
        assert on_device > 3.25 * GIB
