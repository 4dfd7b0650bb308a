"""Builds libvcuda.so and the test double, and runs programs under them on a fake GPU."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from runtime_hook.contract import Limits, render_limits

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
    # This interpreter's wheels: cuda.h, and zig for the glibc 2.17 build of the library.
    subprocess.run(["make", "-s", "-C", str(CSHIM), "tests", f"PYTHON={sys.executable}"],
                   check=True)


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

    def limit(self, memory: int, devices: tuple[str, ...] = (), cores: int = 100,
              virtual: int = 0) -> Path:
        """Write a limits file (as the hook and vcuda-run do) and point the shim at it."""
        path = self.root / "limits"
        limits = Limits(memory=memory, cores=cores, devices=devices, account=str(self.account),
                        virtual_memory=virtual)
        path.write_text(render_limits(limits))
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

    def lines(self, *words: str, mode: str = "link", shim: bool = True,
              **extra: str) -> list[list[str]]:
        """The probe's output, one list of words per line."""
        run = self.run(*words, mode=mode, shim=shim, **extra)
        return [line.split() for line in run.stdout.splitlines()]

    @contextmanager
    def running(self, *words: str, mode: str = "link", shim: bool = True,
                **extra: str) -> Iterator[Background]:
        """Run the probe in the background up to its first ``wait``; kill it at the end."""
        process = subprocess.Popen(
            self.command(*words, mode=mode),
            env=self.environment(shim, **extra),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        background = Background(process)
        try:
            background.lines = background.read_to_wait()
            yield background
        finally:
            process.kill()
            process.wait()


@dataclass
class Background:
    """A probe running in the background, stopped at a ``wait`` command."""

    process: subprocess.Popen[str]
    lines: list[list[str]] = field(default_factory=list)

    def read_to_wait(self) -> list[list[str]]:
        """Lines printed up to the next ``waiting`` (or the end)."""
        assert self.process.stdout is not None
        seen: list[list[str]] = []
        for line in self.process.stdout:
            if line.strip() == "waiting":
                return seen
            seen.append(line.split())
        return seen

    def resume(self) -> list[list[str]]:
        """Let the probe go on to its next ``wait`` or its end; return what it printed."""
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        return self.read_to_wait()


def info(lines: list[list[str]]) -> tuple[int, int]:
    """(free, total) from the last ``info`` line."""
    last = [line for line in lines if line[0] == "info"][-1]
    assert last[1] == "CUDA_SUCCESS", last
    return int(last[2]), int(last[3])


# The shared account's layout (version 2), as cshim/README.md documents it.
ACCOUNT_MAGIC = b"VCUDAACC"
ACCOUNT_VERSION = 2
HEADER = struct.Struct("<8sIIIIIIqII")
UUIDS_AT, UUID_SIZE, LOCK_AT = 64, 96, 1600
GPU_NS_AT = 1856
SLOTS_AT, SLOT = 4096, struct.Struct("<iIQ16Q")


def _uuids(data: bytes) -> list[str]:
    """The account's device table, checking its header on the way."""
    magic, version, _, max_devices, _, slot_size, _, _, ndevices, _ = HEADER.unpack_from(data)
    assert (magic, version, max_devices, slot_size) == (ACCOUNT_MAGIC, ACCOUNT_VERSION, 16,
                                                        SLOT.size)
    raw = (data[UUIDS_AT + dev * UUID_SIZE : UUIDS_AT + (dev + 1) * UUID_SIZE]
           for dev in range(ndevices))
    return [entry.split(b"\0")[0].decode() for entry in raw]


def account_used(path: Path) -> dict[str, int]:
    """Bytes in use per device UUID, summed over the account's slots, as a reader would."""
    data = path.read_bytes()
    bound = HEADER.unpack_from(data)[-1]
    slots = [SLOT.unpack_from(data, SLOTS_AT + i * SLOT.size) for i in range(bound)]
    return {uuid: sum(slot[3 + dev] for slot in slots if slot[0])
            for dev, uuid in enumerate(_uuids(data))}


def account_gpu_ns(path: Path) -> dict[str, int]:
    """GPU time (ns) charged to the container per device UUID, as a reader would."""
    data = path.read_bytes()
    return {uuid: struct.unpack_from("<Q", data, GPU_NS_AT + 8 * dev)[0]
            for dev, uuid in enumerate(_uuids(data))}


def write_slot(path: Path, index: int, pid: int, start: int, used_on_first_device: int) -> None:
    """Put a slot into the account as a process (pid, start time) would have left it."""
    with path.open("r+b") as f:
        data = bytearray(f.read())
        SLOT.pack_into(data, SLOTS_AT + index * SLOT.size, pid, 0, start, used_on_first_device,
                       *[0] * 15)
        fields = list(HEADER.unpack_from(data))
        fields[-1] = max(fields[-1], index + 1)
        HEADER.pack_into(data, 0, *fields)
        f.seek(0)
        f.write(data)


def start_time(pid: int) -> int:
    """A process's start time in clock ticks since boot (/proc/<pid>/stat field 22)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])
