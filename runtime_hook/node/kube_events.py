"""Kubernetes Events the node agent records on its Node, aggregated
(runtime_hook/event_series.py: one Event per kind, repeats counted in its series).

An Event tells ``kubectl describe node`` what the agent did or found, so that an operator
needs no log to learn it. Recording never fails the caller: an Event that cannot be written
is logged and let go.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from runtime_hook.contract import Gpu
from runtime_hook.event_series import (
    NODE_EVENTS_NAMESPACE,
    NORMAL,
    SERIES_INTERVAL,
    WARNING,
    NodeEventSeries,
    Write,
)
from runtime_hook.node.logs import event

__all__ = ["CONTROLLER", "NORMAL", "WARNING", "EventRecorder", "inventory_note"]

CONTROLLER = "vcuda.io/node-agent"  # reportingController of every Event the agent writes


class EventRecorder:
    """Records the agent's Events on node ``node`` through ``api`` (a ``kubernetes``
    ApiClient); call :meth:`flush` once a cycle to write counts that waited."""

    def __init__(self, api: Any, node: str, log: logging.Logger,
                 clock: Callable[[], float] = time.time,
                 interval: float = SERIES_INTERVAL,
                 namespace: str = NODE_EVENTS_NAMESPACE) -> None:
        self._client = api
        self._node = node
        self._log = log
        self._series = NodeEventSeries(CONTROLLER, f"{CONTROLLER}-{node}", clock, interval,
                                       namespace)

    def node_event(self, type_: str, reason: str, action: str, note: str,
                   occurrences: int = 1) -> None:
        """Record ``occurrences`` of an Event about this node (``type_`` NORMAL or WARNING;
        ``reason`` CamelCase, ``action`` what the agent did, ``note`` what happened)."""
        write = self._series.occurred(self._node, type_, reason, action, note, occurrences)
        if write is not None:
            self._send(write)

    def flush(self) -> None:
        """Write each series whose count grew and whose interval has passed."""
        for write in self._series.due():
            self._send(write)

    def _send(self, write: Write) -> None:
        """Send ``write`` and tell the series how it went; a refusal is logged."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        # Sent as it is: the client's Event model would parse eventTime and write it back
        # without the microseconds the API's MicroTime requires whenever they are zero.
        content_type = "application/merge-patch+json" if write.method == "PATCH" else \
            "application/json"
        verb = "create" if write.method == "POST" else "patch"
        what = write.reason if write.method == "POST" else write.name
        status = 0
        try:
            request = self._client.param_serialize(
                write.method, write.path, header_params={"Content-Type": content_type,
                                                         "Accept": "application/json"},
                body=write.body, auth_settings=["BearerToken"])
            answer = self._client.call_api(*request)
            answer.read()
            status = answer.status
            if not 200 <= status < 300:
                raise ApiException(http_resp=answer)
        except ApiException as exc:
            status = exc.status or 0
            event(self._log, logging.WARNING, "event_not_recorded", verb=verb, event=what,
                  status=exc.status, error=str(exc.body or exc.reason)[:300],
                  fix="grant create and patch of events.k8s.io events "
                      "(manifests/base/node-rbac.yaml)" if exc.status == 403 else None)
        except HTTPError as exc:
            event(self._log, logging.WARNING, "event_not_recorded", verb=verb, event=what,
                  error=str(exc))
        self._series.done(write, status)


def inventory_note(gpus: list[Gpu]) -> str:
    """What the inventory of ``gpus`` holds, in one line."""
    listed = ", ".join(f"{gpu.index}: {gpu.uuid} ({gpu.memory / 2**30:.1f} GiB)"
                       for gpu in sorted(gpus, key=lambda gpu: (gpu.index, gpu.uuid)))
    return f"the GPUs the hook may give containers are now {len(gpus)}: {listed or 'none'}"

