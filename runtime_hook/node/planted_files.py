"""Reading a file where a tenant may write: never through a link, only a regular file, bounded."""

from __future__ import annotations

import os
import stat

from runtime_hook.hook_errors import NodeError


class PlantedFileError(NodeError, ValueError):
    """The file cannot be read as the caller's; the message is the reason, to follow its name."""

    fix = "remove the file: the program it belongs to writes it again"


def read_regular(path: str, limit: int, dir_fd: int | None = None,
                 owner: int | None = None) -> tuple[bytes, os.stat_result] | None:
    """The first ``limit`` bytes of the regular file ``path`` (relative to ``dir_fd`` if given)
    and its status; None when it does not exist.

    ``owner``: the uid it must belong to (None: any). Raise PlantedFileError otherwise.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PlantedFileError(f"cannot be opened: {exc.strerror}") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise PlantedFileError("is not a regular file")
        if owner is not None and status.st_uid != owner:
            raise PlantedFileError(f"belongs to uid {status.st_uid}, not to uid {owner}")
        return os.pread(fd, limit, 0), status
    finally:
        os.close(fd)
