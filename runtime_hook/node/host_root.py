"""Node paths as paths here, where the node's root is mounted (``--host-root``): links are
followed as the node follows them."""

from __future__ import annotations

import errno
import os

_MAX_LINKS = 40  # the kernel's limit on links in one lookup


def host_path(host_root: str, node_path: str) -> str:
    """The path here of ``node_path``, a path on the node whose root is at ``host_root``.

    Joining the two is not enough: a link of the node with an absolute target
    (Debian's and Ubuntu's ``/var/run -> /run``) then leads out of ``host_root``
    into this container's own files, where the node's runtime never looks. Each
    link met is followed inside ``host_root``; parts that do not exist yet are
    kept as named. OSError (ELOOP) after 40 links.
    """
    pending = node_path.split("/")[::-1]  # a stack: the next part last
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        here = os.path.join(host_root, *resolved, part)
        if not os.path.islink(here):
            resolved.append(part)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), node_path)
        target = os.readlink(here)
        if target.startswith("/"):
            resolved = []
        pending.extend(target.split("/")[::-1])
    return os.path.join(host_root, *resolved)
