"""Warning Events on the Nodes that filter leaves out whatever the pod (no GPU inventory, an
unreadable or a stale one), so that ``kubectl describe node`` says why no vcuda pod lands
there; the pods' own FailedScheduling events carry the same reason.

Written in the background, never on the path of a scheduler's call, and aggregated
(runtime_hook/event_series.py): a node left out for every pod of a burst is one Event whose
series is written at most once a minute. An Event the API refuses is logged
(``event_not_recorded``) and let go.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any

from extender.policy import NO_INVENTORY, STALE_INVENTORY, UNREADABLE_INVENTORY
from runtime_hook.event_series import SERIES_INTERVAL, WARNING, NodeEventSeries, Write
from webhook.kube import Kube, KubeError

CONTROLLER = "vcuda.io/scheduler-extender"  # reportingController of its Events
ACTION = "LeaveOutOfPlacement"
REASONS = {NO_INVENTORY: "GPUInventoryMissing", UNREADABLE_INVENTORY: "GPUInventoryUnreadable",
           STALE_INVENTORY: "GPUInventoryStale"}
_FIX_403 = ("grant create and patch of events.k8s.io events in default "
            "(manifests/placement/component/extender-rbac.yaml)")


class NodeEvents:
    """The extender's Events about Nodes, written through ``kube``."""

    def __init__(self, kube: Kube, log: Any, clock: Callable[[], float] = time.time,
                 interval: float = SERIES_INTERVAL, instance: str | None = None) -> None:
        self._kube = kube
        self._log = log
        self._series = NodeEventSeries(CONTROLLER,
                                       f"{CONTROLLER}-{instance or socket.gethostname()}",
                                       clock, interval)
        self._interval = interval
        self._sending: set[asyncio.Task[None]] = set()

    def left_out(self, node: str, cause: str, note: str) -> None:
        """Filter left ``node`` out for ``cause`` (a NODE_CAUSE), ``note`` saying why in
        words that stay the same while the cause lasts. A node that is not vcuda's gets no
        Event: nothing is wrong with it."""
        reason = REASONS.get(cause)
        if reason is not None:
            self._start(self._series.occurred(node, WARNING, reason, ACTION, note))

    async def run(self) -> None:
        """Write the series whose counts waited, every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self._interval)
            for write in self._series.due():
                self._start(write)

    async def settled(self) -> None:
        """Wait for the writes in flight."""
        await asyncio.gather(*self._sending, return_exceptions=True)

    def _start(self, write: Write | None) -> None:
        if write is not None:
            task = asyncio.get_running_loop().create_task(self._send(write))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, write: Write) -> None:
        try:
            if write.method == "POST":
                await self._kube.post(write.path, write.body)
            else:
                await self._kube.merge_patch(write.path, write.body)
        except KubeError as exc:
            self._log.warning("event_not_recorded", reason=write.reason, node=write.node,
                              status=exc.status, error=exc.message[:300],
                              **({"fix": _FIX_403} if exc.status == 403 else {}))
            self._series.done(write, exc.status)
        else:
            self._series.done(write, 200)
