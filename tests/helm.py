"""The helm that scripts/build-helm built from its Go module, for the tests that run it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "vcuda"


def helm_binary() -> str:
    """helm's path; the test is skipped where it is not built."""
    built = subprocess.run([str(REPO / "scripts" / "build-helm"), "--print"],
                           capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.skip("helm is not built here: run scripts/build-helm (needs Go)")
    return built.stdout.strip().splitlines()[-1]
