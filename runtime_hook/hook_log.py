"""Log lines: the fields and the time every vcuda log line carries, and the hook's own log.

The webhook and the scheduler extender (JSON lines, through structlog) and the
node agent with its device plugin and DRA driver (JSON lines, through
``logging``) build each line with :func:`log_line`, so that every component
names and formats its time, level and event the same way; the contract exports
them. They live here so that poststop, which reads no contract, loads nothing
more for its log.

The hook's log is text: one line per event appended to a file, so that a quiet
success leaves a trace. A runtime shows a hook's stderr only when the hook
fails, and then the user should read one line; everything else goes here.
Writing the log never fails a container.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing's, without importing typing (the hook's start-up cost)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

LEVELS = ("debug", "info", "warning", "error")
_ROTATE_AT = 1 << 20  # bytes; one older file (.1) is kept

# The field names of a JSON log line, whichever component writes it.
TIME_FIELD = "time"  # ISO 8601, UTC, milliseconds: 2025-01-31T12:00:00.250Z
LEVEL_FIELD = "level"  # debug, info, warning, error or critical
EVENT_FIELD = "event"  # what happened, in snake_case: "review", "resourceslice_created"
_HEAD = dict.fromkeys((TIME_FIELD, LEVEL_FIELD, EVENT_FIELD))


class _Clock:
    """Formats a time as :data:`TIME_FIELD` holds it; the date and the second once a second."""

    def __init__(self) -> None:
        self._second = (-1, "")  # one tuple: threads that log at once never mix two seconds

    def __call__(self, now: float) -> str:
        second, text = self._second
        whole = int(now)
        if whole != second:
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            self._second = (whole, text)
        return f"{text}.{int((now - whole) * 1000):03d}Z"


log_time = _Clock()


def log_line(level: str, fields: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The object of one JSON log line: its time and level, then ``fields`` (``event`` first).

    Args:
        level: the level name as the logging library gives it (``debug``, ``info``,
            ``warning``, ``error``, ``critical``: structlog and logging name them so).
        fields: the event and its keys; ``time`` and ``level`` are not theirs to set.
        now: the time of the event, seconds since the epoch.
    """
    line = {**_HEAD, **fields}  # the head's keys first, in this order
    line[TIME_FIELD] = log_time(now)
    line[LEVEL_FIELD] = level
    return line


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
        stamp = log_time(time.time())
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
