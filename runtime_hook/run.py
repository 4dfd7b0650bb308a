"""`vcuda-run`: runs one command under libvcuda.so with GPU limits, on any Linux GPU machine."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

from runtime_hook.contract import (
    LIMITS_PATH,
    RUN_DIR_PREFIX,
    RUN_LIMITS_ENV,
    RUN_LIMITS_FILE,
    RUN_OWNER_FILE,
    Limits,
    LimitsFormatError,
    render_limits,
    version_flag,
)
from runtime_hook.hook_cli import DEFAULT_LIBRARY
from runtime_hook.hook_errors import UsageError
from runtime_hook.node_state import process_start_time

LIBRARY_ENV = "VCUDA_LIBRARY"
# Where vcuda-node install puts it on a node, then where a distribution would.
_SYSTEM_LIBRARIES = (
    DEFAULT_LIBRARY, "/usr/local/lib/vcuda/libvcuda.so", "/usr/lib/vcuda/libvcuda.so"
)
_HEX_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# GPU-<uuid>, MIG-<uuid> (driver 470 and later), MIG-GPU-<uuid>/<gi>/<ci> (older drivers).
_DEVICE_UUID = re.compile(rf"(?:GPU|MIG)-{_HEX_UUID}|MIG-GPU-{_HEX_UUID}/\d+/\d+")
_UNITS = {
    "": 1,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
}
_ENTRY_POINT = "cuMemAlloc_v2"  # exported by libvcuda.so and by nothing that is not a CUDA driver
_SIZE = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?")

_DESCRIPTION = """\
Runs CMD with libvcuda.so preloaded, so that CMD and every process it starts
see a GPU of --memory bytes: allocations past it fail with out-of-memory, and
cuMemGetInfo, nvidia-smi and NVML report it as the GPU's total. All of them
share one account. Nothing else about CMD changes.

vcuda-run writes the limits to a private directory under $TMPDIR, points the
library at it with $VCUDA_LIMITS_FILE, and replaces itself with CMD (same pid).
Where /etc/vcuda/limits exists (inside a vcuda container) that file wins.
"""

_EPILOG = """\
sizes: a number of bytes, or a number with a unit: Ki, Mi, Gi, Ti (powers of
1024) or k, M, G, T (powers of 1000), as Kubernetes writes them: 4Gi, 512Mi.

examples:
  vcuda-run --memory 4Gi -- python train.py
  vcuda-run --memory 8Gi --devices GPU-5c3d1a2b-... -- ./solver
  vcuda-run --memory 4Gi --account /tmp/team.acct -- python a.py   # and b.py:
  vcuda-run --memory 4Gi --account /tmp/team.acct -- python b.py   # one 4Gi for both
"""


def parse_size(text: str) -> int:
    """Return the bytes that a size such as ``4Gi``, ``512Mi`` or ``1000000`` names."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise UsageError(
            f"bad size {text!r}: write a number of bytes, or a number with a unit "
            "Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T (powers of 1000), e.g. 4Gi"
        )
    number = Decimal(match[1]) * _UNITS[match[2] or ""]
    if number < 1:
        raise UsageError(f"size {text!r} is less than one byte: the limit must be positive")
    return int(number)


def parse_devices(text: str) -> tuple[str, ...]:
    """Return the device UUIDs of ``--devices``; raise UsageError for one that is not a UUID.

    A UUID that names no GPU would leave CMD with limits that match no device.
    """
    devices = tuple(d.strip() for d in text.split(",") if d.strip())
    for device in devices:
        if not _DEVICE_UUID.fullmatch(device):
            raise UsageError(
                f"--devices: {device!r} is not a GPU or MIG UUID: write them as "
                "'nvidia-smi -L' prints them, e.g. GPU-5c3d1a2b-0c1d-4e5f-8a9b-0c1d2e3f4a5b"
            )
    return devices


def _library_candidates() -> list[str]:
    checkout = Path(__file__).resolve().parent.parent / "cshim" / "build" / "libvcuda.so"
    named = os.environ.get(LIBRARY_ENV)
    return [*([named] if named else []), str(checkout), *_SYSTEM_LIBRARIES]


def find_library(explicit: str | None) -> Path:
    """Return libvcuda.so: ``explicit``, $VCUDA_LIBRARY, this checkout's build, or a system path.

    The library must load: the dynamic loader skips a preload that does not
    (with a warning on stderr) and runs the command unlimited.
    """
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise UsageError(f"--library {explicit}: no such file")
        return _loadable(path.resolve(), f"--library {explicit}")
    candidates = _library_candidates()
    for candidate in candidates:
        if Path(candidate).is_file():
            return _loadable(Path(candidate).resolve(), candidate)
    looked = ", ".join(candidates)
    raise UsageError(
        f"libvcuda.so not found (looked at {looked}): build it with 'make -C cshim', "
        f"or name it with --library or ${LIBRARY_ENV}"
    )


def _sweep_stale_dirs(base: Path) -> None:
    """Remove the directories of earlier vcuda-run commands whose process has ended."""
    for directory in base.glob(RUN_DIR_PREFIX + "*"):
        try:
            if directory.stat().st_uid != os.getuid():
                continue
            pid, start = (directory / RUN_OWNER_FILE).read_text().split()
        except (OSError, ValueError):
            continue
        if process_start_time(int(pid)) != int(start):
            shutil.rmtree(directory, ignore_errors=True)


def _write_limits(limits: Limits, directory: Path) -> Path:
    path = directory / RUN_LIMITS_FILE
    path.write_text(render_limits(limits))
    path.chmod(0o444)
    return path


def _loadable(path: Path, shown: str) -> Path:
    """Return ``path`` when it loads and exports the CUDA entry points; raise UsageError if not.

    It is loaded in a child process, so that nothing of it stays in this one.
    """
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:
        status = 0
        try:
            import ctypes

            library = ctypes.CDLL(str(path), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
            if not hasattr(library, _ENTRY_POINT):
                raise OSError(f"it exports no {_ENTRY_POINT}: it is not libvcuda.so")
        except OSError as exc:
            os.write(write_end, str(exc).encode(errors="replace")[:1000])
            status = 1
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as report:
        why = report.read().decode(errors="replace")
    _, wait_status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(wait_status) != 0:
        raise UsageError(f"{shown}: does not load as a library ({why or 'the loader crashed'})")
    return path


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vcuda-run",
        usage="vcuda-run --memory SIZE [--virtual-memory SIZE] [--cores N] [--devices UUID,...] "
        "[--account FILE] -- CMD ...",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    version_flag(parser)
    parser.add_argument("--memory", required=True, metavar="SIZE", help="GPU memory for CMD")
    parser.add_argument(
        "--virtual-memory",
        default="0",
        metavar="SIZE",
        help="of --memory, the part that may live in host memory once the rest is taken on "
        "the GPU (cudaMalloc and the allocators built on it; slower, over the bus); less than "
        "--memory; default 0: all of it on the GPU",
    )
    parser.add_argument(
        "--cores",
        type=int,
        default=100,
        metavar="N",
        help="percent of each GPU's time, 1..100 (default 100: no pacing)",
    )
    parser.add_argument(
        "--devices",
        default="",
        metavar="UUID,...",
        help="GPU or MIG UUIDs (as nvidia-smi -L prints them, any case) the limits apply to; "
        "CMD gets no memory on any other GPU; default: every GPU",
    )
    parser.add_argument(
        "--account",
        metavar="FILE",
        help="shared account file: commands given the same one share the memory; "
        "default: a new one for this command",
    )
    parser.add_argument(
        "--library",
        metavar="PATH",
        help=f"libvcuda.so to preload; default: ${LIBRARY_ENV}, then this checkout's "
        f"cshim/build, {os.path.dirname(DEFAULT_LIBRARY)} (where vcuda-node install puts it), "
        "/usr/local/lib/vcuda, /usr/lib/vcuda",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    return parser


def _prepare(args: argparse.Namespace) -> tuple[list[str], dict[str, str], Path]:
    """Check the arguments, write the limits; return the command, its environment and the dir."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError(
            "no command given: write it after '--', e.g. vcuda-run --memory 4Gi -- nvidia-smi"
        )
    memory = parse_size(args.memory)
    virtual = parse_size(args.virtual_memory) if args.virtual_memory.strip() != "0" else 0
    library = find_library(args.library)
    devices = parse_devices(args.devices)
    base = Path(tempfile.gettempdir())
    _sweep_stale_dirs(base)
    directory = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=base))
    try:
        account = args.account or str(directory / "account")
        limits = Limits(memory=memory, cores=args.cores, devices=devices, account=account,
                        virtual_memory=virtual)
        path = _write_limits(limits, directory)
        owner = f"{os.getpid()} {process_start_time(os.getpid())}\n"
        (directory / RUN_OWNER_FILE).write_text(owner)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    # First in CMD's environment, where the node agent looks for it (run_dirs).
    env = {RUN_LIMITS_ENV: str(path),
           **{k: v for k, v in os.environ.items() if k != RUN_LIMITS_ENV}}
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{library}:{preload}" if preload else str(library)
    return command, env, directory


def main(argv: list[str] | None = None) -> int:
    """Run ``vcuda-run``; returns an exit status only when CMD could not be started."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        command, env, directory = _prepare(args)
    except (UsageError, LimitsFormatError) as exc:
        parser.error(str(exc))
    if Path(LIMITS_PATH).exists():
        print(
            f"vcuda-run: {LIMITS_PATH} exists here and wins: CMD runs with its limits",
            file=sys.stderr,
        )
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        missing = isinstance(exc, FileNotFoundError)
        reason = "command not found" if missing else exc.strerror
        print(f"vcuda-run: {command[0]}: {reason}", file=sys.stderr)
        return 127 if missing else 126


if __name__ == "__main__":
    sys.exit(main())
