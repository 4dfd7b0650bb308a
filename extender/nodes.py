"""The extender's own view of the vcuda Nodes (``nodeCacheCapable: true``): the name,
resourceVersion and annotations of each Node labelled ``vcuda.io/enabled=true``, from a list
and then a watch of their metadata.

The scheduler then sends node names only, and filter and prioritize read the GPU inventory and
ledger here. Nothing here outlives the process: it is listed again at start, and after any
watch error (a version too old to watch from, 410, included); until that list is in, the view
is not ready and the extender leaves every node out and says why. A watch the API server ends
after its timeout is taken up again from the last version seen.

A node whose vcuda annotations cannot be read is logged (``node_unreadable``, with the reason)
when they arrive, once per change of them; placement leaves that node alone out, for the same
reason.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any
from urllib.parse import quote

import msgspec

from extender.errors import ExtenderError
from extender.policy import unreadable
from runtime_hook.contract import ENABLED_LABEL, INVENTORY_ANNOTATION, LEDGER_ANNOTATION
from webhook.json_errors import DECODE_ERRORS, why_refused
from webhook.kube import Kube, KubeError

SELECTOR = f"{ENABLED_LABEL}=true"  # where vcuda's node DaemonSet runs
_PATH = f"/api/v1/nodes?labelSelector={quote(SELECTOR)}"
# Metadata alone: the annotations are all that is read, and a Node's status is most of it.
_LIST_AS = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
_WATCH_AS = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
WATCH_SECONDS = 300  # asked of the API server per watch; it ends the watch after that
_RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)  # between failed lists, the last one repeated
_PLACEMENT = (INVENTORY_ANNOTATION, LEDGER_ANNOTATION)  # the annotations placement reads


class Meta(msgspec.Struct, frozen=True):
    """What the view keeps of a Node: its metadata's name, version and annotations."""

    name: str = ""
    version: str = msgspec.field(default="", name="resourceVersion")
    annotations: dict[str, str] | None = None


class _Object(msgspec.Struct, frozen=True):
    metadata: Meta = Meta()
    code: int = 0  # of a Status (an ERROR event)
    message: str = ""


class _List(msgspec.Struct, frozen=True):
    metadata: Meta = Meta()
    items: list[_Object] | None = None


class _Event(msgspec.Struct, frozen=True):
    type: str
    object: _Object = _Object()


_decode_list = msgspec.json.Decoder(_List).decode
_decode_event = msgspec.json.Decoder(_Event).decode


class NodeView:
    """The vcuda Nodes' metadata by name, and whether it is ready (listed since the last
    watch error)."""

    def __init__(self) -> None:
        self._nodes: dict[str, Meta] = {}
        self.ready = False
        self.version = ""  # of the list or the last event: where a watch starts

    def get(self, name: str) -> Meta | None:
        return self._nodes.get(name)

    def replace(self, nodes: list[Meta], version: str) -> dict[str, Meta]:
        """Take a fresh list's nodes and version; the view is ready. Return the nodes it had."""
        before, self._nodes = self._nodes, {meta.name: meta for meta in nodes}
        self.version = version
        self.ready = True
        return before

    def put(self, meta: Meta) -> None:
        """Take a Node's newer metadata: from the watch, or the answer to a write of ours
        (which may come before the watch's event of it, or after a later one)."""
        held = self._nodes.get(meta.name)
        if held is None or not _older(meta.version, held.version):
            self._nodes[meta.name] = meta

    def remove(self, name: str) -> None:
        self._nodes.pop(name, None)


def _older(version: str, than: str) -> bool:
    """Whether ``version`` is older than ``than``. resourceVersions are etcd's revision
    numbers, as kube-scheduler's own assume cache reads them; anything else counts as newer."""
    try:
        return int(version) < int(than)
    except ValueError:
        return False


class WatchError(ExtenderError):
    """The watch must start again from a fresh list; the message says why."""


class NodeWatch:
    """Keeps a :class:`NodeView` from the API: list, watch, list again after an error."""

    def __init__(self, kube: Kube, view: NodeView, log: Any) -> None:
        self._kube = kube
        self.view = view
        self._log = log

    async def run(self) -> None:
        """List and watch until cancelled."""
        failures = 0
        while True:
            try:
                await self._list()
                failures = 0
                while True:
                    await self._watch()
            except Exception as exc:  # a fault of this code too: never a view stuck as ready
                self.view.ready = False
                expected = isinstance(exc, (KubeError, WatchError))
                self._log.warning("node_watch_failed", reason=str(exc) if expected
                                  else f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(_RETRY_SECONDS[min(failures, len(_RETRY_SECONDS) - 1)])
            failures += 1

    async def _list(self) -> None:
        answer = await self._kube.read(_PATH, accept=_LIST_AS)
        try:
            listed = _decode_list(answer)
        except DECODE_ERRORS:
            raise WatchError("the node list is not a NodeList: "
                             f"{why_refused(answer, _List, 'NodeList')}") from None
        before = self.view.replace([item.metadata for item in listed.items or ()],
                                   listed.metadata.version)
        for item in listed.items or ():
            self._check(item.metadata, before.get(item.metadata.name))
        self._log.info("nodes_listed", nodes=len(listed.items or ()),
                       version=listed.metadata.version)

    async def _watch(self) -> None:
        """One watch from the view's version, until the API server ends it."""
        path = (f"{_PATH}&watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECONDS}"
                f"&resourceVersion={quote(self.view.version)}")
        try:
            async with aclosing(self._kube.lines(path, accept=_WATCH_AS,
                                                 idle=WATCH_SECONDS + 60)) as lines:
                async for line in lines:
                    self._apply(line)
        except KubeError as exc:
            raise WatchError(f"watching nodes: {exc.message}") from None

    def _apply(self, line: bytes) -> None:
        try:
            event = _decode_event(line)
        except DECODE_ERRORS:
            raise WatchError("a node watch event is not JSON of an event: "
                             f"{why_refused(line, _Event, 'the event')}") from None
        meta = event.object.metadata
        if event.type in ("ADDED", "MODIFIED"):
            held = self.view.get(meta.name)
            self.view.put(meta)
            self._check(meta, held)
        elif event.type == "DELETED":  # or no longer labelled
            self.view.remove(meta.name)
        elif event.type == "ERROR":  # 410: the version is too old to watch from
            raise WatchError(f"the API server ended the node watch: {event.object.code} "
                             f"{event.object.message}")
        elif event.type != "BOOKMARK":
            raise WatchError(f"a node watch event of unknown type {event.type!r}")
        if meta.version:
            self.view.version = meta.version

    def _check(self, meta: Meta, held: Meta | None) -> None:
        """Log that a node's vcuda annotations cannot be read, if they changed from ``held``
        (its metadata before): once per content, however often the node is sent."""
        now, before = meta.annotations or {}, (held.annotations or {}) if held else None
        if before is not None and all(now.get(key) == before.get(key) for key in _PLACEMENT):
            return
        problem = unreadable(now)
        if problem is not None:
            self._log.warning("node_unreadable", node=meta.name, reason=problem)
