"""The file that nodes run as the OCI hook, with nothing installed but Python's standard library.

    /usr/bin/python3 -I -S /usr/local/vcuda/python/runtime_hook/oci_hook.py STAGE [OPTIONS]

``-I`` keeps the hook's Python deaf to ``PYTHON*`` variables and user site
directories; the package is found beside this file. The console script
``vcuda-hook`` runs the same :func:`main`.

Every container of the ``vcuda`` runtime runs the hook twice, pod sandboxes
and containers without limits too. Those are let go here, from the OCI
state's bytes, before any other module is loaded or the flags are read
(``vcuda-node install`` checks the flags it writes): on a 2-vCPU machine
loading ``os`` alone costs 1.4 ms of an interpreter start of 8 ms.
"""

from __future__ import annotations

import posix  # the core of os, loaded with the interpreter: _exit without importing os
import sys

MAX_STATE = 4 << 20
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


def main() -> int:
    """Run the hook with the process's arguments and the OCI state on stdin; return its status."""
    args = sys.argv[1:]
    if "-h" in args or "--help" in args or ("prestart" not in args and "poststop" not in args):
        # Help, or a command line without a stage to refuse: for a person at a
        # terminal, who would have to close stdin, and who must not be let go silently.
        state = b""
    else:
        state = sys.stdin.buffer.read(MAX_STATE)
        if surely_unlimited(state):
            return 0
    if __name__ == "__main__":  # run as a file: the package is above this file's real directory
        import os

        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    from runtime_hook import hook_main

    return hook_main.main(args, state)


if __name__ == "__main__":
    status = main()
    # Tearing the interpreter down (freeing every module and object) costs 1.5
    # to 3.5 ms of each hook run and serves nothing: the hook's files are
    # written with os.write or closed by their `with` blocks, and the kernel
    # drops its fds and locks. Only the standard streams may hold output.
    sys.stdout.flush()
    sys.stderr.flush()
    posix._exit(status)
