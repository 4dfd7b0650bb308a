"""The node agent's watch of its pods' ends: which events say a pod ended, and a watch that is
taken up again where it stopped, and listed afresh after a failure."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator

import pytest

from runtime_hook.node.ended_pods import EndedPods, WatchEnded, ended_uid


def line(kind: str, uid: str = "", version: str = "", phase: str = "") -> bytes:
    obj: dict = {"metadata": {"uid": uid, "resourceVersion": version}}
    if phase:
        obj["status"] = {"phase": phase}
    return json.dumps({"type": kind, "object": obj}).encode()


@pytest.mark.parametrize(("event", "uid"), [
    (line("DELETED", "u1", "7", "Running"), "u1"),
    (line("MODIFIED", "u2", "8", "Succeeded"), "u2"),
    (line("ADDED", "u3", "9", "Failed"), "u3"),
    (line("MODIFIED", "u4", "10", "Running"), None),
    (line("ADDED", "u5", "11", "Pending"), None),
    (line("BOOKMARK", "", "12"), None),
])
def test_a_pod_ends_when_deleted_or_when_its_phase_is_final(event: bytes, uid: str | None) -> None:
    assert ended_uid(event) == (uid, json.loads(event)["object"]["metadata"]["resourceVersion"])


def test_an_error_event_ends_the_watch_with_the_api_servers_words() -> None:
    error = json.dumps({"type": "ERROR", "object": {
        "kind": "Status", "code": 410, "message": "too old resource version: 5 (90)"}})
    with pytest.raises(WatchEnded, match=r"^the API server ended the pod watch: 410 too old "
                                         r"resource version: 5 \(90\)$"):
        ended_uid(error)


@pytest.mark.parametrize("garbage", [b"{not json", b"[]", b'{"type": "ADDED"}'])
def test_a_line_that_is_no_event_ends_the_watch_naming_it(garbage: bytes) -> None:
    with pytest.raises(WatchEnded, match=r"^a pod watch event is not JSON of an event: "):
        ended_uid(garbage)


class ScriptedPods:
    """The API server's side: each list answers the next version of ``versions``; each watch
    plays the next script (lines, or an exception to raise), recording the version asked."""

    def __init__(self, versions: list[str], scripts: list[list[bytes] | Exception]) -> None:
        self._versions, self._scripts = versions, scripts
        self.watched_from: queue.Queue[str] = queue.Queue()
        self.watched_at: list[float] = []
        self._blocked = threading.Event()  # the last watch waits here until interrupted

    def pods_version(self) -> str:
        return self._versions.pop(0)

    def watch_pods(self, version: str,
                   seconds: int) -> tuple[Generator[bytes, None, None], Callable[[], None]]:
        self.watched_at.append(time.monotonic())
        self.watched_from.put(version)
        script = self._scripts.pop(0) if self._scripts else None

        def lines() -> Generator[bytes, None, None]:
            if isinstance(script, Exception):
                raise script
            if script is None:
                self._blocked.wait()
                return
            yield from script

        return lines(), self._blocked.set


def test_ends_are_told_and_the_watch_goes_on_from_the_last_version_then_lists_after_a_fault(
        caplog: pytest.LogCaptureFixture) -> None:
    pods = ScriptedPods(["5", "40"], [
        [line("ADDED", "a", "6", "Running"), line("DELETED", "a", "7"), b"",
         line("BOOKMARK", "", "9")],
        [line("MODIFIED", "b", "10", "Failed")],
        OSError("connection reset by peer"),
    ])
    ended: queue.Queue[str] = queue.Queue()
    watch = EndedPods(pods, "gpu-1", ended.put, logging.getLogger("test"))
    with caplog.at_level(logging.WARNING):
        watch.start()
        try:
            assert [ended.get(timeout=5), ended.get(timeout=5)] == ["a", "b"]
            # From the list's version, then from the last event's (a bookmark's too), then a
            # fresh list's after the fault.
            assert [pods.watched_from.get(timeout=5) for _ in range(4)] == ["5", "9", "10", "40"]
        finally:
            watch.stop()
    [record] = [r for r in caplog.records if r.getMessage() == "pod_watch_failed"]
    assert record.fields == {"node": "gpu-1",  # type: ignore[attr-defined]
                             "reason": "connection reset by peer"}
    assert ended.empty()


def test_a_fault_that_stays_is_logged_once_and_the_watch_tried_again_after_longer_pauses(
        caplog: pytest.LogCaptureFixture) -> None:
    denied = OSError("not allowed to watch pods")
    pods = ScriptedPods(["1", "2", "3"], [denied, denied])
    watch = EndedPods(pods, "gpu-1", lambda uid: None, logging.getLogger("test"))
    with caplog.at_level(logging.WARNING):
        watch.start()
        try:
            asked = [pods.watched_from.get(timeout=10) for _ in range(3)]
        finally:
            watch.stop()
    assert asked == ["1", "2", "3"]  # each time from a fresh list
    first, second, third = pods.watched_at
    assert second - first >= 1.0 and third - second >= 2.0  # the pauses grow
    assert [r.getMessage() for r in caplog.records] == ["pod_watch_failed"]
