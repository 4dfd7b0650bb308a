"""Structured logs of the webhook: one JSON object per line."""

from __future__ import annotations

import logging
import time
from typing import Any, BinaryIO

import msgspec
import structlog

_ENCODER = msgspec.json.Encoder()


class _Timestamper:
    """Adds ``timestamp`` in ISO 8601 UTC with milliseconds; formats each second once."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, _: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        event["timestamp"] = f"{self._prefix}.{int((now - second) * 1000):03d}Z"
        return event


def _render(_: Any, __: str, event: dict[str, Any]) -> bytes:
    return _ENCODER.encode(event)


def make_logger(stream: BinaryIO) -> Any:
    """Return a structlog logger that writes JSON lines (INFO and above) to ``stream``."""
    return structlog.wrap_logger(
        structlog.BytesLogger(stream),
        processors=[
            structlog.processors.add_log_level,
            _Timestamper(),
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    ).bind()  # the bound logger itself, not a proxy that builds it on each call
