"""Entry point of the OCI hook ``vcuda-hook``: a fast exit for containers without limits.

Every container of the ``vcuda`` runtime runs this twice (prestart, poststop),
so the common case, a container with no limits, is answered from the OCI state
alone, before any module beyond ``os`` and ``sys`` is imported. Everything else
goes to :mod:`runtime_hook.hook_cli`.

Nodes run it without installing anything: ``python3 -I -S <dir>/runtime_hook/oci_hook.py``.
"""

from __future__ import annotations

import os
import sys

_STAGES = ("prestart", "poststop")
_MAX_STATE = 4 << 20
# Exact bytes of a sandbox marker as Go's encoding/json (containerd, CRI-O) and
# crun write them; any other spelling only loses the shortcut.
_SANDBOX = (
    b'"io.kubernetes.cri.container-type":"sandbox"',
    b'"io.kubernetes.cri-o.ContainerType":"sandbox"',
)


def surely_unlimited(state: bytes) -> bool:
    """True when the raw OCI state proves that the container has no vcuda limits.

    That holds for a pod sandbox, or when no annotation mentions ``vcuda.io``:
    the runtime spec puts a container's annotations in its state (runc and crun
    do), and JSON encoders never escape ASCII letters, digits or dots, so the
    key cannot hide behind an escape.
    """
    return any(marker in state for marker in _SANDBOX) or b"vcuda.io" not in state


def main(argv: list[str] | None = None) -> int:
    """Run the hook; return its exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    wants_help = any(a in ("-h", "--help") for a in args)
    state = None
    if args[:1] and args[0] in _STAGES and not wants_help:
        state = sys.stdin.buffer.read(_MAX_STATE)
        if surely_unlimited(state):
            return 0
    from runtime_hook import hook_cli  # imported here to keep it off the fast path

    return hook_cli.run(args, state)


if __name__ == "__main__":
    # Run as a file (python3 -I puts no directory on sys.path): import the package beside it.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    sys.exit(main())
