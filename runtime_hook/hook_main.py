"""The hook's main: read the flags, run the stage, and turn a failure into the line a runtime shows.

:mod:`runtime_hook.oci_hook` has let containers that surely have no limits go
already; what comes here may have some. This module keeps to ``os``, ``sys``,
``fcntl`` and ``time``, which is all poststop needs; only prestart loads the
rest.
"""

from __future__ import annotations

import os
import sys

from runtime_hook.hook_cli import LOCK_TIMEOUT, USAGE, Flags, help_text, parse_args
from runtime_hook.hook_errors import HookError, UsageError
from runtime_hook.hook_log import HookLog
from runtime_hook.node_state import StateDir


def main(args: list[str], state: bytes) -> int:
    """Run the hook with the arguments ``args`` on the OCI ``state``; return its exit status."""
    if any(arg in ("-h", "--help") for arg in args):
        sys.stdout.write(help_text())
        return 0
    if "--version" in args:
        from runtime_hook.contract import VERSION  # the node's copy has no package metadata

        sys.stdout.write(f"vcuda-hook {VERSION}\n")
        return 0
    try:
        flags = parse_args(args)
    except UsageError as exc:
        sys.stderr.write(f"{USAGE}\nvcuda-hook: error: {exc}\n")
        return 2
    log = HookLog(flags.log_file, flags.log_level, flags.stage)
    try:
        if flags.stage == "poststop":
            _poststop(flags, log)
        else:
            from runtime_hook import prestart  # the heavy part: poststop never loads it

            prestart.run(state, flags, log)
    except Exception as exc:  # every failure ends as one line a user can act on
        error = (
            exc
            if isinstance(exc, HookError)
            else HookError(
                f"unexpected {type(exc).__name__}: {exc}",
                "see the hook's log on the node, and report it to vcuda",
            )
        )
        line = error.line()
        log.error(line)
        if flags.stage == "prestart":
            StateDir(flags.state_dir).count_refusal()
        sys.stderr.write(line + "\n")
        return 1
    return 0


def _poststop(flags: Flags, log: HookLog) -> None:
    """Release what containers that are gone (this one among them) had committed."""
    state = StateDir(flags.state_dir)
    if not os.path.isdir(state.containers):
        return  # no limited container ever started here
    with state.locked(LOCK_TIMEOUT):
        released = state.release_gone()
    if released:
        log.info(f"released {', '.join(released)}")
