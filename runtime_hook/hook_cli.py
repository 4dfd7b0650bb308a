"""The hook's command line: flags, the stage to run, and the one-line error a runtime shows."""

from __future__ import annotations

import argparse
import os
import sys

from runtime_hook import stages
from runtime_hook.gpu_inventory import InventoryError
from runtime_hook.hook_errors import HookError
from runtime_hook.hook_log import LEVELS, HookLog
from runtime_hook.ledger import LedgerError
from runtime_hook.limits_decision import container_name, pod_of
from runtime_hook.limits_file import LimitsFormatError
from runtime_hook.oci_spec import Container, load_config, parse_state

DEFAULT_STATE_DIR = "/run/vcuda"
DEFAULT_LIBRARY = "/usr/local/vcuda/lib/libvcuda.so"

_DESCRIPTION = """\
OCI hook of vcuda. Run by the container runtime (runc, crun) with the OCI
state on stdin: 'prestart' makes libvcuda.so, /etc/vcuda/limits and
/etc/ld.so.preload present inside each container that has an entry in the
pod annotation vcuda.io/limits, after checking that its GPU memory fits on
this node; 'poststop' releases that memory. Other containers are left
untouched. On failure it prints one line on stderr and exits 1, and the
runtime does not start the container.
"""


def build_parser() -> argparse.ArgumentParser:
    """The hook's argument parser (the manifests' hook entries are checked against it)."""
    parser = argparse.ArgumentParser(prog="vcuda-hook", description=_DESCRIPTION)
    parser.add_argument("stage", choices=("prestart", "poststop"), help="OCI hook stage")
    parser.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help="root-only directory of the node ledger, per-container files and the log "
        "(default: %(default)s; a tmpfs is best: its records die with the node)",
    )
    parser.add_argument(
        "--library",
        default=DEFAULT_LIBRARY,
        help="host path of libvcuda.so, bind-mounted into containers (default: %(default)s)",
    )
    parser.add_argument(
        "--inventory",
        help="GPU inventory file written by the node agent (default: STATE_DIR/gpus.json); "
        "when it is missing, GPU memory is not checked",
    )
    parser.add_argument(
        "--memory-scaling",
        type=_positive_float,
        default=1.0,
        help="share of each GPU's memory that limited containers may commit, "
        "e.g. 1.5 to overcommit by half (default: %(default)s)",
    )
    parser.add_argument(
        "--account-mib",
        type=_positive_int,
        default=4,
        help="size of each container's /run/vcuda tmpfs in MiB (default: %(default)s)",
    )
    parser.add_argument(
        "--log-file",
        help="where to append the log (default: STATE_DIR/hook.log; '-': stderr)",
    )
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="(default: info)")
    return parser


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 100]")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive whole number")
    return value


def run(argv: list[str], state: bytes | None) -> int:
    """Run one stage with ``state`` (read from stdin when None); return the exit status."""
    args = build_parser().parse_args(argv)
    options = stages.Options(
        state_dir=args.state_dir,
        library=args.library,
        inventory=args.inventory or os.path.join(args.state_dir, "gpus.json"),
        memory_scaling=args.memory_scaling,
        account_mib=args.account_mib,
    )
    log = HookLog(args.log_file or os.path.join(args.state_dir, "hook.log"), args.log_level)
    if state is None:
        state = sys.stdin.buffer.read()
    container: Container | None = None
    try:
        container = parse_state(state)
        if args.stage == "prestart":
            container = load_config(container)
            log.tag = f"prestart {_describe(container)}"
            stages.prestart(container, options, log)
        else:
            log.tag = f"poststop {_describe(container)}"
            stages.poststop(container, options, log)
    except Exception as exc:  # every failure ends as one line a user can act on
        line = _as_hook_error(exc).line(_describe(container) if container else "")
        log.error(line)
        print(line, file=sys.stderr)
        return 1
    return 0


def _describe(container: Container) -> str:
    parts = (*pod_of(container.annotations), container_name(container.annotations))
    name = "/".join(p for p in parts if p)
    return f"{name} ({container.id[:12]})" if name else container.id[:12]


def _as_hook_error(exc: Exception) -> HookError:
    if isinstance(exc, HookError):
        return exc
    if isinstance(exc, InventoryError):
        return HookError(str(exc), "restart the node agent: it rewrites the inventory")
    if isinstance(exc, LimitsFormatError):
        return HookError(f"limits cannot be written: {exc}", "check NVIDIA_VISIBLE_DEVICES")
    if isinstance(exc, LedgerError):
        return HookError(str(exc), "check --state-dir on this node")
    return HookError(
        f"unexpected {type(exc).__name__}: {exc}",
        "check the hook's log on the node and report it to vcuda",
    )
