"""Shared pytest configuration: GPU tests are skipped where no NVIDIA GPU is present."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _gpu_present() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and b"GPU" in result.stdout


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("VCUDA_FORCE_GPU_TESTS") == "1" or _gpu_present():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
