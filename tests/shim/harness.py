"""Builds libvcuda.so and the test double, and runs programs under them on a fake GPU."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from runtime_hook.limits_file import Limits, render

REPO = Path(__file__).resolve().parents[2]
CSHIM = REPO / "cshim"
BUILD = CSHIM / "build"
LIBRARY = BUILD / "libvcuda.so"
TESTS = BUILD / "tests"
MIB = 1 << 20
GIB = 1 << 30
#: The fake driver's context size (VCUDA_FAKE_CONTEXT_MIB default).
CONTEXT = 96 * MIB


def build() -> None:
    """Build the shim, the test double and the test programs (quietly, once per session)."""
    subprocess.run(["make", "-s", "-C", str(CSHIM), "tests"], check=True)


def fake_uuid(device: int) -> str:
    """The UUID the test double gives physical device ``device``."""
    raw = bytes(0x10 * (device + 1) + k for k in range(16)).hex()
    return f"GPU-{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"


@dataclass
class FakeGpu:
    """A fake machine: device memory shared by its processes, a limits file, an account."""

    root: Path
    gpus_mib: tuple[int, ...] = (8192,)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(TESTS),
            "VCUDA_FAKE_STATE": str(self.root / "gpu-state"),
            "VCUDA_FAKE_GPUS": ",".join(str(m) for m in self.gpus_mib),
        }

    @property
    def account(self) -> Path:
        return self.root / "account"

    def limit(self, memory: int, devices: tuple[str, ...] = (), cores: int = 100) -> Path:
        """Write a limits file (as the hook and vcuda-run do) and point the shim at it."""
        path = self.root / "limits"
        limits = Limits(memory=memory, cores=cores, devices=devices, account=str(self.account))
        path.write_text(render(limits))
        self.env["VCUDA_LIMITS_FILE"] = str(path)
        return path

    def command(self, *words: str, mode: str = "link") -> list[str]:
        return [str(TESTS / "probe"), mode, *words]

    def environment(self, shim: bool = True, **extra: str) -> dict[str, str]:
        env = dict(self.env, **extra)
        if shim:
            env["LD_PRELOAD"] = str(LIBRARY)
        return env

    def run(
        self, *words: str, mode: str = "link", shim: bool = True, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """Run the probe with ``words`` as its commands; it must exit cleanly."""
        result = subprocess.run(
            self.command(*words, mode=mode),
            env=self.environment(shim, **extra),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result

    def lines(self, *words: str, **kwargs: str) -> list[list[str]]:
        """The probe's output, one list of words per line."""
        return [line.split() for line in self.run(*words, **kwargs).stdout.splitlines()]

    def start(self, *words: str, mode: str = "link", **extra: str) -> subprocess.Popen[str]:
        """Start the probe in the background; talk to it through stdin/stdout."""
        return subprocess.Popen(
            self.command(*words, mode=mode),
            env=self.environment(True, **extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def read_until(process: subprocess.Popen[str], word: str) -> list[list[str]]:
    """Lines a background probe prints up to (and with) the first that starts with ``word``."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line.split())
        if seen[-1][:1] == [word]:
            return seen
    raise AssertionError(f"probe ended before {word!r}: {seen}")


def info(lines: list[list[str]]) -> tuple[int, int]:
    """(free, total) from the last ``info`` line."""
    last = [line for line in lines if line[0] == "info"][-1]
    assert last[1] == "CUDA_SUCCESS", last
    return int(last[2]), int(last[3])
