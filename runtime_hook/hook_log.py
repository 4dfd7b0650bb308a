"""The hook's log: one line per event appended to a file, so that a quiet success leaves a trace.

A runtime shows a hook's stderr only when the hook fails, and then the user
should read one line; everything else goes here. Writing the log never fails
a container.
"""

from __future__ import annotations

import os
import sys
import time

LEVELS = ("debug", "info", "warning", "error")
_ROTATE_AT = 1 << 20  # bytes; one older file (.1) is kept


class HookLog:
    """Appends ``<time> vcuda-hook[<pid>] <LEVEL> <tag>: <message>`` lines to a file or stderr."""

    def __init__(self, path: str, level: str, tag: str = "") -> None:
        self._path = path
        self._min = LEVELS.index(level)
        self.tag = tag

    def debug(self, message: str) -> None:
        self._write(0, message)

    def info(self, message: str) -> None:
        self._write(1, message)

    def warning(self, message: str) -> None:
        self._write(2, message)

    def error(self, message: str) -> None:
        self._write(3, message)

    def _write(self, level: int, message: str) -> None:
        if level < self._min:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        line = f"{stamp} vcuda-hook[{os.getpid()}] {LEVELS[level].upper()} {self.tag}: {message}\n"
        if self._path == "-":
            sys.stderr.write(line)
            return
        try:
            if os.path.getsize(self._path) > _ROTATE_AT:
                os.replace(self._path, self._path + ".1")
        except OSError:
            pass  # no file yet
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        try:
            try:
                fd = os.open(self._path, flags, 0o640)
            except FileNotFoundError:  # a fresh node: the state dir is not there yet
                os.makedirs(os.path.dirname(self._path), mode=0o755, exist_ok=True)
                fd = os.open(self._path, flags, 0o640)
        except OSError:
            return
        try:
            os.write(fd, line.encode(errors="replace"))
        except OSError:
            pass  # a full or failing disk: the line is lost, the container is not
        finally:
            os.close(fd)
