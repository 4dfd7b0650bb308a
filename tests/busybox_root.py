"""A container root of busybox-static alone, for real containers where no image store exists.

The demo, the tests and the hook's benchmark run real runtimes on such roots;
all of them run from a checkout, and nothing installed imports this module.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

BUSYBOX = shutil.which("busybox") or "/usr/bin/busybox"


def make_busybox_root(path: Path, applets: Iterable[str]) -> Path:
    """Create a root at ``path``: ``/bin/busybox``, a link per applet, and the usual empty dirs.

    Args:
        path: the root to create; its parent must exist, it must not.
        applets: names to link to busybox in ``/bin``, e.g. ``("sh", "cat")``.
    """
    (path / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, path / "bin" / "busybox")
    for applet in applets:
        (path / "bin" / applet).symlink_to("busybox")
    for name in ("etc", "tmp", "proc", "sys", "dev"):
        (path / name).mkdir(exist_ok=True)
    return path
