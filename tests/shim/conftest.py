"""Fixtures for the libvcuda.so tests: the build, and a fake GPU machine per test."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.shim.harness import BUILD, CSHIM, FakeGpu, build


@pytest.fixture(scope="session")
def shim_build() -> None:
    build()


@pytest.fixture
def gpu(shim_build: None, tmp_path: Path) -> FakeGpu:
    """One fake 8 GiB GPU, no limits yet."""
    return FakeGpu(tmp_path)


@pytest.fixture
def two_gpus(shim_build: None, tmp_path: Path) -> FakeGpu:
    """Two fake GPUs of 8 and 16 GiB."""
    return FakeGpu(tmp_path, gpus_mib=(8192, 16384))


@pytest.fixture(scope="module")
def programs() -> Path:
    """libvcuda.so, the probe, and the nvcc-built programs of a GPU machine."""
    subprocess.run(["make", "-s", "-C", str(CSHIM), "gpu"], check=True)
    return BUILD
