"""The pods bound to one node, watched for their end: each one deleted, or whose phase becomes
Succeeded or Failed, is told to placement at once, so that its ledger line (and the room it
holds on a GPU) goes within a second instead of at the agent's next pass.

The watch starts from a fresh list's resourceVersion and is taken up again from the last
version seen when the API server ends it; after any error (410 included) it lists again, after
a pause. A pod that ends while no watch runs is still pruned by the agent's pass.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Generator
from contextlib import closing
from typing import Protocol

from runtime_hook.hook_errors import NodeError
from runtime_hook.node.logs import event

WATCH_SECONDS = 300  # asked of the API server per watch; it ends the watch after that
_RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0)  # between failed watches, the last one repeated
ENDED_PHASES = ("Succeeded", "Failed")


class WatchEnded(NodeError):
    """The watch must start again from a fresh list; the message says why."""


def ended_uid(line: bytes | str) -> tuple[str | None, str]:
    """The UID of the pod that an event line of the watch says ended (None: it says no such
    thing), and the resourceVersion the event carries ("" for none)."""
    try:
        change = json.loads(line)
        kind, obj = change["type"], change["object"]
        metadata = obj.get("metadata") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise WatchEnded(f"a pod watch event is not JSON of an event: {line[:200]!r}") from None
    if kind == "ERROR":  # 410: the version is too old to watch from
        raise WatchEnded(f"the API server ended the pod watch: {obj.get('code')} "
                         f"{obj.get('message')}")
    version = str(metadata.get("resourceVersion") or "")
    ended = kind == "DELETED" or (kind in ("ADDED", "MODIFIED")
                                  and (obj.get("status") or {}).get("phase") in ENDED_PHASES)
    return (str(metadata["uid"]) if ended and metadata.get("uid") else None), version


class PodSource(Protocol):
    """What the watch needs of the API server (:class:`NodeStatus` gives it)."""

    def pods_version(self) -> str:
        """The resourceVersion of a fresh list of the node's pods."""

    def watch_pods(self, version: str,
                   seconds: int) -> tuple[Generator[bytes, None, None], Callable[[], None]]:
        """The event lines of a watch of the node's pods from ``version`` (closed: the
        connection is given back), and how to interrupt it from another thread."""


class EndedPods:
    """Calls ``ended(uid)`` for each pod of the node that ends, from a thread of its own."""

    def __init__(self, source: PodSource, node: str, ended: Callable[[str], None],
                 log: logging.Logger) -> None:
        self._source, self._node, self._ended, self._log = source, node, ended, log
        self._stopping = threading.Event()
        self._interrupt: Callable[[], None] | None = None  # of the watch under way
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ended-pods", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            interrupt = self._interrupt
        if interrupt is not None:
            interrupt()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)

    def _run(self) -> None:
        failures = 0
        said = ""  # the reason logged last: a fault that stays is logged once
        while not self._stopping.is_set():
            try:
                version = self._source.pods_version()
                while not self._stopping.is_set():
                    version = self._watch(version)
                    failures, said = 0, ""
            except Exception as exc:  # a fault of this code too: the watch must come back
                if self._stopping.is_set():
                    return
                reason = str(exc) or type(exc).__name__
                if reason != said:
                    event(self._log, logging.WARNING, "pod_watch_failed", node=self._node,
                          reason=reason)
                    said = reason
            self._stopping.wait(_RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)])
            failures += 1

    def _watch(self, version: str) -> str:
        """One watch from ``version`` until the API server ends it; the last version seen."""
        lines, interrupt = self._source.watch_pods(version, WATCH_SECONDS)
        with self._lock:
            self._interrupt = interrupt
        if self._stopping.is_set():  # stop() came before the watch was there to interrupt
            interrupt()
        try:
            with closing(lines):
                for line in lines:
                    if not line.strip():
                        continue
                    uid, seen = ended_uid(line)
                    version = seen or version
                    if uid is not None:
                        self._ended(uid)
        finally:
            with self._lock:
                self._interrupt = None
        return version
