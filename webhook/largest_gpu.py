"""The cluster's largest GPU share, as vcuda's node agents publish it on their Nodes.

Each node agent writes ``vcuda.io/max-gpu-memory`` on its Node: the bytes of its
largest GPU times its memory scaling, the most one shared container may have
there. The webhook lists the Nodes labelled ``vcuda.io/enabled=true`` every
interval, metadata alone and from the API server's cache, and bounds
``vcuda-memory`` requests by the largest value found.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple
from urllib.parse import quote

from runtime_hook.contract import (
    ENABLED_LABEL,
    MAX_GPU_MEMORY,
    MAX_GPU_MEMORY_ANNOTATION,
    MEMORY_UNIT,
)
from webhook.kube import Kube, KubeError

# resourceVersion=0: served from the API server's watch cache, not a quorum read of etcd.
NODES_PATH = f"/api/v1/nodes?labelSelector={quote(f'{ENABLED_LABEL}=true')}&resourceVersion=0"
METADATA_ONLY = ("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
                 "application/json")


class Largest(NamedTuple):
    """The largest share published, in bytes, and the node that publishes it."""

    memory: int
    node: str


def largest_published(items: Iterable[object]) -> tuple[Largest | None, list[str]]:
    """The largest share the Nodes ``items`` publish (None: none does), and the names of those
    whose value is not a number of bytes from 256 MiB to ``MAX_GPU_MEMORY`` (1 PiB) in plain
    decimal digits. Whatever a Node holds, this neither raises nor takes more than a glance."""
    best: Largest | None = None
    malformed = []
    for item in items:
        metadata = item.get("metadata") if isinstance(item, dict) else None
        metadata = metadata if isinstance(metadata, dict) else {}
        annotations = metadata.get("annotations")
        value = annotations.get(MAX_GPU_MEMORY_ANNOTATION) if isinstance(annotations,
                                                                         dict) else None
        if value is None:
            continue
        name = str(metadata.get("name", "?"))[:_NAME_CHARS]
        memory = _share(value)
        if memory is None:
            malformed.append(name)
        elif best is None or memory > best.memory:
            best = Largest(memory, name)
    return best, sorted(malformed)


_DIGITS = len(str(MAX_GPU_MEMORY))  # the text is bounded before int() reads it
_NAME_CHARS = 253  # a Node's name


def _share(value: object) -> int | None:
    """The bytes of a published share; None when ``value`` is not one."""
    if not (isinstance(value, str) and 0 < len(value) <= _DIGITS and value.isascii()
            and value.isdigit()):
        return None
    memory = int(value)
    return memory if MEMORY_UNIT <= memory <= MAX_GPU_MEMORY else None


class LargestGpu:
    """Keeps the largest published share; ``use`` gets it (None: no Node publishes one) when
    it changes."""

    def __init__(self, kube: Kube, interval: float, log: Any,
                 use: Callable[[int | None], None]) -> None:
        self._kube = kube
        self._interval = interval
        self._log = log
        self._use = use
        self._largest: Largest | None = None
        self._problem = ""  # the last one logged, so that a lasting one is logged once

    async def refresh(self) -> None:
        """List the Nodes once; on failure keep what was learned before, and log why. Never
        raises: the webhook starts, and goes on polling, whatever the Nodes hold."""
        try:
            answer = await self._kube.get(NODES_PATH, accept=METADATA_ONLY)
            items = answer.get("items") if isinstance(answer, dict) else None
            largest, malformed = largest_published(items if isinstance(items, list) else ())
        except KubeError as exc:
            self._report(f"cannot list nodes: {exc.message}")
            return
        self._report(f"{MAX_GPU_MEMORY_ANNOTATION} is not a number of bytes from 256 MiB to "
                     f"1 PiB in decimal digits on {', '.join(malformed)}" if malformed else "")
        if largest != self._largest:
            self._largest = largest
            self._log.info("max_gpu_memory_learned", bytes=largest and largest.memory,
                           node=largest and largest.node)
            self._use(largest and largest.memory)

    async def run(self) -> None:
        """Refresh every interval until cancelled."""
        while True:
            await asyncio.sleep(self._interval)
            await self.refresh()

    def _report(self, problem: str) -> None:
        if problem != self._problem:
            if problem:
                self._log.warning("max_gpu_memory_unread", reason=problem)
            else:
                self._log.info("max_gpu_memory_read")
            self._problem = problem
