"""Every component's log lines carry their time, level and event under the same names, in the
same format, written by one piece of code (the contract's ``log_line``)."""

from __future__ import annotations

import calendar
import io
import json
import logging
import re
import time
from pathlib import Path

import pytest

from runtime_hook.hook_log import HookLog
from runtime_hook.node import logs as node_logs
from webhook.logs import make_logger

REPO = Path(__file__).resolve().parents[1]
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _webhook_line() -> dict:
    """A line of the webhook's logger, which vcuda-certs and the scheduler extender use too."""
    stream = io.BytesIO()
    make_logger(stream).warning("probe_event", key=1)
    return json.loads(stream.getvalue())


def _node_agent_line(capsys: pytest.CaptureFixture[str]) -> dict:
    """A line of the node agent's logger, which its device plugin and DRA driver use too."""
    log = node_logs.setup("info")
    node_logs.event(log, logging.WARNING, "probe_event", key=1)
    return json.loads(capsys.readouterr().err)


def _seconds_since(stamp: str) -> float:
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    then = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return time.time() - (then + int(fraction) / 1000)


def test_the_webhook_and_the_node_agent_write_the_same_fields_in_the_same_format(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = {"webhook": _webhook_line(), "node agent": _node_agent_line(capsys)}
    for component, line in lines.items():
        assert list(line) == ["time", "level", "event", "key"], component
        assert (line["level"], line["event"], line["key"]) == ("warning", "probe_event", 1)
        assert TIME.fullmatch(line["time"]), (component, line["time"])
        assert 0 <= _seconds_since(line["time"]) < 5, (component, line["time"])


def test_the_hook_log_starts_each_line_with_the_same_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    HookLog("-", "info", "prestart").warning("probe")
    stamp, rest = capsys.readouterr().err.split(" ", 1)
    assert TIME.fullmatch(stamp) and 0 <= _seconds_since(stamp) < 5
    assert rest.endswith("WARNING prestart: probe\n")


def test_an_event_cannot_overwrite_the_time_or_the_level() -> None:
    stream = io.BytesIO()
    make_logger(stream).error("clash", time="yesterday", level="low")
    line = json.loads(stream.getvalue())
    assert TIME.fullmatch(line["time"]) and line["level"] == "error"


# The modules that may turn an event into a line; any other formatter would be a second format.
WRITERS = {"runtime_hook/hook_log.py", "webhook/logs.py", "runtime_hook/node/logs.py"}
_FORMATTING = re.compile(r"logging\.Formatter|structlog\.(wrap_logger|configure)|TimeStamper"
                         r"|strftime|\"timestamp\"")


def test_no_other_module_formats_log_lines() -> None:
    found = {
        str(path.relative_to(REPO))
        for package in ("webhook", "runtime_hook", "extender", "demo")
        for path in (REPO / package).rglob("*.py")
        if _FORMATTING.search(path.read_text())
    }
    assert found == WRITERS
