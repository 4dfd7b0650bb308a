"""Fixtures for the libvcuda.so tests: the build, and a fake GPU machine per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shim.harness import FakeGpu, build


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
