"""The diagnostic build's unpaced windows (cshim/src/pace_windows.h), on the test double: the
diagnostic library leaves every other window's launches unpaced, and the library itself never
does, whatever the container's environment says."""

from __future__ import annotations

from pathlib import Path

from tests.shim.harness import BUILD, LIBRARY, FakeGpu
from tests.shim.test_pacing import HELD_LOAD, limited, pacing_tally

DIAGNOSTIC = BUILD / "diag" / "libvcuda.so"


def paced_of_launched(gpu: FakeGpu, library: Path) -> tuple[int, int]:
    """Runs HELD_LOAD's 1.5 s of small launches at 30 under library, with 100 ms windows
    asked for: the launches the library paced, and all the loop launched."""
    limited(gpu, 30)
    result = gpu.run(*HELD_LOAD, shim=False, LD_PRELOAD=str(library), VCUDA_LOG_LEVEL="info",
                     VCUDA_PACE_WINDOW_MS="100")
    launched = int(result.stdout.splitlines()[-1].split()[1])
    return pacing_tally(result.stderr)[0], launched


def test_the_diagnostic_library_paces_every_other_window_only(gpu: FakeGpu) -> None:
    paced, launched = paced_of_launched(gpu, DIAGNOSTIC)
    # 15 windows of 100 ms, every other one paced: about half the launches.
    assert launched > 7000
    assert 0.3 * launched < paced < 0.7 * launched, (paced, launched)


def test_the_library_paces_every_launch_whatever_the_environment_asks(gpu: FakeGpu) -> None:
    paced, launched = paced_of_launched(gpu, LIBRARY)
    assert paced == launched > 7000
    assert b"VCUDA_PACE_WINDOW_MS" not in LIBRARY.read_bytes()
