"""Binds of one extender take turns on each node's ledger.

kube-scheduler sends its binds at once, each from its own binding cycle. Without turns, the
binds to one node all compute their ledger from the same version and all but one meet a
conflict, read the node again and redo: on a burst that is a few reads and writes more per
pod, paid by the API server. Taking turns, each bind starts from the ledger the one before it
wrote (the view takes every write at once), and a conflict means another writer: another
replica, or the node agent pruning.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class NodeTurns:
    """One lock per node while some bind waits for it or holds it; none kept for idle nodes."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: Counter[str] = Counter()  # binds holding or waiting for each node's lock

    @asynccontextmanager
    async def of(self, node: str) -> AsyncIterator[None]:
        """Hold ``node``'s turn for the body of the ``async with``."""
        lock = self._locks.setdefault(node, asyncio.Lock())
        self._users[node] += 1
        try:
            async with lock:
                yield
        finally:
            self._users[node] -= 1
            if not self._users[node]:
                del self._users[node], self._locks[node]

    def __len__(self) -> int:
        return len(self._locks)
