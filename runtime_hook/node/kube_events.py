"""Kubernetes Events (``events.k8s.io/v1``) the node agent records on its Node, aggregated.

An Event tells ``kubectl describe node`` what the agent did or found, so that an operator
needs no log to learn it. Occurrences of one kind (same object, reason and note) make one
Event: the first creates it, the next ones are counted and written into its ``series``
(count, last observed time) at most once per ``interval`` seconds, as Kubernetes' own
recorders do, so a problem that repeats every cycle costs one write a minute, not one a
cycle. Recording never fails the caller: an Event that cannot be written is logged and let go.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from runtime_hook.contract import Gpu
from runtime_hook.node.logs import event

NORMAL, WARNING = "Normal", "Warning"
CONTROLLER = "vcuda.io/node-agent"  # reportingController of every Event the agent writes
# The API takes an Event about a cluster-scoped object (a Node) in default or kube-system
# alone; vcuda's Role there allows the agent to create and patch Events and nothing else.
NODE_EVENTS_NAMESPACE = "default"
SERIES_INTERVAL = 60.0  # seconds between two writes of one Event's series
_KEPT = 256  # kinds of Event remembered for aggregation (the oldest is forgotten)


@dataclass
class _Series:
    name: str
    count: int  # occurrences so far
    written: int  # occurrences the API holds
    last_write: float
    last_seen: float


class EventRecorder:
    """Records the agent's Events on node ``node`` through ``api`` (a ``kubernetes``
    ApiClient); call :meth:`flush` once a cycle to write counts that waited."""

    def __init__(self, api: Any, node: str, log: logging.Logger,
                 clock: Callable[[], float] = time.time,
                 interval: float = SERIES_INTERVAL,
                 namespace: str = NODE_EVENTS_NAMESPACE) -> None:
        self._client = api
        self._namespace = namespace
        self._node = node
        self._log = log
        self._clock = clock
        self._interval = interval
        self._series: OrderedDict[tuple[str, str, str], _Series] = OrderedDict()

    def node_event(self, type_: str, reason: str, action: str, note: str,
                   occurrences: int = 1) -> None:
        """Record ``occurrences`` of an Event about this node (``type_`` NORMAL or WARNING;
        ``reason`` CamelCase, ``action`` what the agent did, ``note`` what happened)."""
        now = self._clock()
        key = (type_, reason, note)
        series = self._series.get(key)
        if series is None:
            self._create(key, type_, reason, action, note, occurrences, now)
            return
        self._series.move_to_end(key)
        series.count += occurrences
        series.last_seen = now
        self._write_series(series, now)

    def flush(self) -> None:
        """Write each series whose count grew and whose interval has passed."""
        now = self._clock()
        for series in list(self._series.values()):
            self._write_series(series, now)

    def _create(self, key: tuple[str, str, str], type_: str, reason: str, action: str,
                note: str, occurrences: int, now: float) -> None:
        # As Kubernetes names them, object.time, within a DNS subdomain's 253 characters.
        name = f"{self._node[:236]}.{time.time_ns():x}"
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": name, "namespace": self._namespace},
            "eventTime": _micro_time(now), "type": type_, "reason": reason, "action": action,
            "note": note.encode()[:1024].decode(errors="ignore"),  # the API's bound, bytes
            "reportingController": CONTROLLER,
            "reportingInstance": f"{CONTROLLER}-{self._node}"[:128],
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": self._node,
                          "uid": self._node},  # kubelet's convention: a Node's uid is its name
        }
        if occurrences > 1:
            body["series"] = {"count": occurrences, "lastObservedTime": _micro_time(now)}
        if not self._send("create", reason, "POST", self._path(), body):
            return  # not remembered: the next occurrence tries to create it again
        self._series[key] = _Series(name, occurrences, occurrences,
                                    now, now)
        while len(self._series) > _KEPT:
            self._series.popitem(last=False)

    def _write_series(self, series: _Series, now: float) -> None:
        if series.count == series.written or now - series.last_write < self._interval:
            return
        patch = {"series": {"count": series.count,
                            "lastObservedTime": _micro_time(series.last_seen)}}
        if self._send("patch", series.name, "PATCH", f"{self._path()}/{series.name}", patch):
            series.written, series.last_write = series.count, now

    def _path(self) -> str:
        return f"/apis/events.k8s.io/v1/namespaces/{self._namespace}/events"

    def _send(self, verb: str, what: str, method: str, path: str, body: dict[str, Any]) -> bool:
        """Write ``body``; False (logged) when the API did not take it."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        # Sent as it is: the client's Event model would parse eventTime and write it back
        # without the microseconds the API's MicroTime requires whenever they are zero.
        content_type = "application/merge-patch+json" if method == "PATCH" else \
            "application/json"
        try:
            request = self._client.param_serialize(
                method, path, header_params={"Content-Type": content_type,
                                             "Accept": "application/json"},
                body=body, auth_settings=["BearerToken"])
            answer = self._client.call_api(*request)
            answer.read()
            if not 200 <= answer.status < 300:
                raise ApiException(http_resp=answer)
        except ApiException as exc:
            event(self._log, logging.WARNING, "event_not_recorded", verb=verb, event=what,
                  status=exc.status, error=str(exc.body or exc.reason)[:300],
                  fix="grant create and patch of events.k8s.io events "
                      "(manifests/base/node-rbac.yaml)" if exc.status == 403 else None)
            if exc.status == 404:  # the Event expired (the API keeps them an hour): start anew
                self._series = OrderedDict((k, s) for k, s in self._series.items()
                                           if s.name != what)
            return False
        except HTTPError as exc:
            event(self._log, logging.WARNING, "event_not_recorded", verb=verb, event=what,
                  error=str(exc))
            return False
        return True


def inventory_note(gpus: list[Gpu]) -> str:
    """What the inventory of ``gpus`` holds, in one line."""
    listed = ", ".join(f"{gpu.index}: {gpu.uuid} ({gpu.memory / 2**30:.1f} GiB)"
                       for gpu in sorted(gpus, key=lambda gpu: (gpu.index, gpu.uuid)))
    return f"the GPUs the hook may give containers are now {len(gpus)}: {listed or 'none'}"


def _micro_time(seconds: float) -> str:
    """``seconds`` since the epoch as a Kubernetes MicroTime."""
    moment = datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)
    return moment.isoformat(timespec="microseconds") + "Z"
