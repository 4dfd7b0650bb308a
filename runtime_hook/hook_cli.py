"""The hook's command line: its flags, their defaults, and ``--help``.

The settings of the hook, read by its stages and by the node agent (which
writes the hook's command line into the runtime's configuration). The flags
are read by hand: argparse, with the ``re`` it imports, would cost more than
all of poststop.
"""

from __future__ import annotations

import os

from runtime_hook.hook_errors import UsageError
from runtime_hook.hook_log import LEVELS

TYPE_CHECKING = False  # typing's, without importing typing (the hook's start-up cost)
if TYPE_CHECKING:
    from typing import Any

    from runtime_hook.contract import Sharing

DEFAULT_STATE_DIR = "/run/vcuda"
DEFAULT_LIBRARY = "/usr/local/vcuda/lib/libvcuda.so"
STAGES = ("prestart", "poststop")
LOCK_TIMEOUT = 5.0  # seconds; the manifests give the hook 10

USAGE = ("usage: vcuda-hook {prestart,poststop} [--OPTION VALUE ...]  (--help explains; "
         "--version prints vcuda's)")
_ABOUT = """\
OCI hook of vcuda, run by the container runtime (runc, crun) with the OCI
state on stdin. prestart: for a container that has an entry in the pod
annotation vcuda.io/limits, commit its GPU memory and time on the GPUs the
device plugin gave it (refused when a GPU is full) and make libvcuda.so, a
read-only /etc/vcuda/limits and /etc/ld.so.preload present inside it.
poststop: release what containers that are gone had committed. Containers
without limits are left untouched. On failure it prints one line on stderr
and exits 1, and the container does not start.
"""


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(f"{text} is not a positive whole number")
    return value


def _memory_scaling(text: str) -> float:
    # Imported only here and for the inventory's path: poststop needs no contract.
    from runtime_hook.contract import memory_scaling

    return memory_scaling(text)


def _cores_scaling(text: str) -> float:
    from runtime_hook.contract import cores_scaling

    return cores_scaling(text)


def _max_sharers(text: str) -> int:
    from runtime_hook.contract import max_sharers

    return max_sharers(text)


def _level(text: str) -> str:
    if text not in LEVELS:
        raise ValueError(f"{text!r} is not one of {', '.join(LEVELS)}")
    return text


# flag: (attribute, conversion, default, help)
_OPTIONS: dict[str, tuple] = {
    "--state-dir": (
        "state_dir",
        str,
        DEFAULT_STATE_DIR,
        "root-only directory of the node ledger, per-container files and the log; "
        "best on a tmpfs, whose records die with the node",
    ),
    "--library": ("library", str, DEFAULT_LIBRARY, "host path of libvcuda.so"),
    "--inventory": (
        "inventory",
        str,
        None,
        "GPU inventory written by the node agent (default STATE_DIR/{inventory}); "
        "without it GPU memory is not checked",
    ),
    "--memory-scaling": (
        "memory_scaling",
        _memory_scaling,
        1.0,
        "share of each GPU's memory that limited containers may commit, 1.5 to overcommit",
    ),
    "--cores-scaling": (
        "cores_scaling",
        _cores_scaling,
        1.0,
        "the cores of the containers sharing one GPU may add up to 100 times this, "
        "1.5 to overcommit (busy containers then split the GPU's time); 1 to 10",
    ),
    "--max-sharers": (
        "max_sharers",
        _max_sharers,
        0,
        "the most limited containers on one GPU, 0 for no cap",
    ),
    "--account-mib": ("account_mib", _positive, 4, "size of each container's /run/vcuda tmpfs"),
    "--log-file": (
        "log_file",
        str,
        None,
        "log to append to (default STATE_DIR/hook.log; - stderr)",
    ),
    "--log-level": ("log_level", _level, "info", "one of " + ", ".join(LEVELS)),
}


class Flags:
    """The parsed command line."""

    def __init__(self, stage: str, values: dict[str, Any]) -> None:
        self.stage = stage
        self.state_dir: str = values["state_dir"]
        self.library: str = values["library"]
        self._inventory: str | None = values["inventory"]
        self.memory_scaling: float = values["memory_scaling"]
        self.cores_scaling: float = values["cores_scaling"]
        self.max_sharers: int = values["max_sharers"]
        self.account_mib: int = values["account_mib"]
        self.log_file: str = values["log_file"] or os.path.join(self.state_dir, "hook.log")
        self.log_level: str = values["log_level"]

    @property
    def sharing(self) -> Sharing:
        """The node's settings for shared GPUs, as the flags give them."""
        from runtime_hook.contract import Sharing

        return Sharing(self.memory_scaling, self.cores_scaling, self.max_sharers)

    @property
    def inventory(self) -> str:
        """The GPU inventory's path: --inventory, else the node agent's file in the state dir."""
        from runtime_hook.contract import INVENTORY_NAME

        return self._inventory or os.path.join(self.state_dir, INVENTORY_NAME)


def help_text() -> str:
    """What ``--help`` prints."""
    from runtime_hook.contract import INVENTORY_NAME

    lines = [USAGE, "", _ABOUT, "options:"]
    for flag, (_, _, default, text) in _OPTIONS.items():
        text = text.format(inventory=INVENTORY_NAME)
        shown = f" (default {default})" if default is not None else ""
        lines.append(f"  {flag} VALUE\n      {text}{shown}")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> Flags:
    """Parse ``<stage> [--option value | --option=value ...]``; raise UsageError."""
    values = {attr: default for attr, _, default, _ in _OPTIONS.values()}
    stages = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--"):
            stages.append(arg)
            continue
        flag, has_value, value = arg.partition("=")
        if flag not in _OPTIONS:
            raise UsageError(f"unknown option {flag}")
        if not has_value:
            if not args:
                raise UsageError(f"{flag} needs a value")
            value = args.pop(0)
        attr, convert, _, _ = _OPTIONS[flag]
        try:
            values[attr] = convert(value)
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    if len(stages) != 1 or stages[0] not in STAGES:
        raise UsageError(f"expected one stage, prestart or poststop, got {stages}")
    return Flags(stages[0], values)
