"""Which Kubernetes Events (``events.k8s.io/v1``) about Nodes to write, aggregated as
Kubernetes' own recorders do; writing them is the caller's (the node agent's client is
synchronous, the extender's asynchronous).

Occurrences of one kind (same Node, type, reason and note) make one Event: the first creates
it, the next ones are counted and written into its ``series`` (count, last observed time) at
most once per ``interval`` seconds, so a problem that repeats every pass costs one write a
minute. The caller sends each :class:`Write` it is given and reports the answer's status with
:meth:`NodeEventSeries.done`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

NORMAL, WARNING = "Normal", "Warning"
# The API takes an Event about a cluster-scoped object (a Node) in default or kube-system
# alone; vcuda's Roles there allow creating and patching Events and nothing else.
NODE_EVENTS_NAMESPACE = "default"
SERIES_INTERVAL = 60.0  # seconds between two writes of one Event's series
_KEPT = 256  # kinds of Event remembered for aggregation (the oldest is forgotten)
_Key = tuple[str, str, str, str]  # node, type, reason, note


@dataclass(frozen=True)
class Write:
    """One request to send: ``method`` POST (a new Event) or PATCH (its series)."""

    method: str
    path: str
    body: dict[str, Any]
    name: str  # of the Event
    reason: str
    count: int  # occurrences it carries
    key: _Key = field(repr=False)

    @property
    def node(self) -> str:
        """The Node the Event is about."""
        return self.key[0]


@dataclass
class _Series:
    name: str
    count: int  # occurrences so far
    written: int  # occurrences the API holds (0: its creation is not answered yet)
    last_write: float
    last_seen: float


class NodeEventSeries:
    """The Events of ``controller`` (its ``reportingController``; ``instance`` its
    ``reportingInstance``) about Nodes, and what each still needs written."""

    def __init__(self, controller: str, instance: str, clock: Callable[[], float] = time.time,
                 interval: float = SERIES_INTERVAL,
                 namespace: str = NODE_EVENTS_NAMESPACE) -> None:
        self._controller = controller
        self._instance = instance[:128]
        self._clock = clock
        self._interval = interval
        self.namespace = namespace
        self._series: OrderedDict[_Key, _Series] = OrderedDict()

    def occurred(self, node: str, type_: str, reason: str, action: str, note: str,
                 occurrences: int = 1) -> Write | None:
        """``occurrences`` of an Event about Node ``node`` (``type_`` NORMAL or WARNING;
        ``reason`` CamelCase, ``action`` what was done, ``note`` what happened): the write it
        needs now, if any."""
        now = self._clock()
        note = note.encode()[:1024].decode(errors="ignore")  # the API's bound, in bytes
        key = (node, type_, reason, note)
        series = self._series.get(key)
        if series is None:
            return self._create(key, action, occurrences, now)
        self._series.move_to_end(key)
        series.count += occurrences
        series.last_seen = now
        return self._patch(key, series, now)

    def due(self) -> list[Write]:
        """The series whose count grew and whose interval has passed."""
        now = self._clock()
        return [write for key, series in list(self._series.items())
                if (write := self._patch(key, series, now)) is not None]

    def done(self, write: Write, status: int) -> None:
        """The API answered ``write`` with HTTP ``status`` (0: it was not reached)."""
        series = self._series.get(write.key)
        if series is None or series.name != write.name:
            return
        if 200 <= status < 300:
            series.written, series.last_write = max(series.written, write.count), self._clock()
        elif write.method == "POST" or status == 404:
            # Not created, or expired (the API keeps Events an hour): the next occurrence
            # creates it anew, with the count so far.
            del self._series[write.key]

    def _create(self, key: _Key, action: str, occurrences: int, now: float) -> Write:
        node, type_, reason, note = key
        # As Kubernetes names them, object.time, within a DNS subdomain's 253 characters.
        name = f"{node[:236]}.{time.time_ns():x}"
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": self.namespace},
            "eventTime": _micro_time(now), "type": type_, "reason": reason, "action": action,
            "note": note, "reportingController": self._controller,
            "reportingInstance": self._instance,
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": node,
                          "uid": node},  # kubelet's convention: a Node's uid is its name
        }
        if occurrences > 1:
            body["series"] = {"count": occurrences, "lastObservedTime": _micro_time(now)}
        self._series[key] = _Series(name, occurrences, 0, now, now)
        while len(self._series) > _KEPT:
            self._series.popitem(last=False)
        return Write("POST", self._path(), body, name, reason, occurrences, key)

    def _patch(self, key: _Key, series: _Series, now: float) -> Write | None:
        if not series.written or series.count == series.written or \
                now - series.last_write < self._interval:
            return None
        series.last_write = now  # one write in flight per interval
        body = {"series": {"count": series.count,
                           "lastObservedTime": _micro_time(series.last_seen)}}
        return Write("PATCH", f"{self._path()}/{series.name}", body, series.name, key[2],
                     series.count, key)

    def _path(self) -> str:
        return f"/apis/events.k8s.io/v1/namespaces/{self.namespace}/events"


def _micro_time(seconds: float) -> str:
    """``seconds`` since the epoch as a Kubernetes MicroTime."""
    moment = datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)
    return moment.isoformat(timespec="microseconds") + "Z"
