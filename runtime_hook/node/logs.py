"""The agent's logs: JSON lines on stderr, and problems logged once rather than at every scrape."""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter
from typing import Any

from runtime_hook.contract import EVENT_FIELD, log_line
from runtime_hook.hook_log import LEVELS as LEVELS  # --log-level takes the hook's levels

LOGGER = "vcuda-node"


class _JsonLines(logging.Formatter):
    """The contract's log line (time, level, event, then the event's fields), as JSON."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {EVENT_FIELD: record.getMessage(), **getattr(record, "fields", {})}
        line = log_line(record.levelname.lower(), fields, record.created)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _Stderr(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a line is written."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # logging must never take the agent down
            self.handleError(record)


def setup(level: str) -> logging.Logger:
    """Send the agent's logs to stderr as JSON lines at ``level`` and above; return its logger."""
    handler = _Stderr()
    handler.setFormatter(_JsonLines())
    log = logging.getLogger(LOGGER)
    log.handlers[:] = [handler]
    log.setLevel(level.upper())
    log.propagate = False
    return log


def event(log: logging.Logger, level: int, name: str, **fields: Any) -> None:
    """Log the event ``name`` with ``fields`` as keys of its line."""
    log.log(level, name, extra={"fields": fields})


class Problems:
    """Bad data met while collecting, logged when it appears, changes or goes away.

    A scrape every 15 s would otherwise repeat the same warning forever. Call
    :meth:`cycle_done` at the end of each pass; ``counts`` holds how often each
    source failed, for the agent's own metrics. ``task`` (``metrics``,
    ``advertise``) says in the log lines which of the agent's passes met it.
    """

    def __init__(self, log: logging.Logger, task: str) -> None:
        self.log = log
        self.task = task
        self._active: dict[str, str] = {}
        self._sources: dict[str, str] = {}  # of each key reported
        self._seen: set[str] = set()
        self.counts: Counter[str] = Counter()

    def report(self, source: str, key: str, message: str) -> None:
        """Note that ``key`` (one file, one GPU, ...) of ``source`` is unusable, and why."""
        self.counts[source] += 1
        self._seen.add(key)
        self._sources[key] = source
        if self._active.get(key) != message:
            self._active[key] = message
            event(self.log, logging.WARNING, "skipped", task=self.task, source=source, what=key,
                  reason=message)

    def active(self) -> list[tuple[str, str, str]]:
        """The problems standing now: (source, what is unusable, why)."""
        return [(self._sources[key], key, message) for key, message in self._active.items()]

    def cycle_done(self) -> None:
        """End one pass: problems not reported in it are resolved."""
        for key in [k for k in self._active if k not in self._seen]:
            del self._active[key]
            event(self.log, logging.INFO, "recovered", task=self.task, what=key)
        self._seen = set()
