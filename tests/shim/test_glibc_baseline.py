"""libvcuda.so loads in old images: it needs no glibc symbol newer than 2.17."""

from __future__ import annotations

import re
import subprocess

from tests.shim.harness import LIBRARY

BASELINE = (2, 17)


def test_the_library_needs_no_glibc_symbol_newer_than_2_17(shim_build: None) -> None:
    table = subprocess.run(["objdump", "-T", str(LIBRARY)], capture_output=True, text=True,
                           check=True).stdout
    versions = {tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_([0-9.]+)", table)}
    assert versions, "objdump found no versioned glibc symbol"
    newer = sorted(v for v in versions if v > BASELINE)
    assert not newer, f"needs glibc {newer}: build it with zig (scripts/setup installs ziglang)"
