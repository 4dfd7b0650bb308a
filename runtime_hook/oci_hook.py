"""The file that nodes run as the OCI hook, with nothing installed but Python's standard library.

    /usr/bin/python3 -I -S /usr/local/vcuda/python/runtime_hook/oci_hook.py STAGE [OPTIONS]

``-I`` keeps the hook's Python deaf to ``PYTHON*`` variables and user site
directories; the package is found beside this file. The console script
``vcuda-hook`` runs the same :func:`main`.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    """Run the hook; return its exit status."""
    from runtime_hook import hook_cli  # importable once __main__ below has set the path

    return hook_cli.main()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    status = main()
    # Tearing the interpreter down (freeing every module and object) costs 1.5
    # to 3.5 ms of each hook run and serves nothing: the hook's files are
    # written with os.write or closed by their `with` blocks, and the kernel
    # drops its fds and locks. Only the standard streams may hold output.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
