"""A memo of the least recently used answers, bounded by the bytes its entries are charged.

What the extender remembers is keyed by what nodes publish, which a node can make large and
can change at every write: a bound by count alone lets one node's large values fill memory.
Each entry is charged what it holds (its key's text and what was decoded from it); past the
budget the least recently used entries go.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    """Answers by key, at most ``budget`` bytes of them as charged."""

    __slots__ = ("_entries", "budget", "charged")

    def __init__(self, budget: int) -> None:
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.budget = budget
        self.charged = 0  # bytes charged to the entries held

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The answer kept for ``key``, now the most recently used; None when none is."""
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: K, value: V, cost: int) -> V:
        """Keep ``value`` for ``key``, charged ``cost`` bytes (one over the budget is not kept),
        letting the least recently used go past the budget; return ``value``."""
        held = self._entries.pop(key, None)
        if held is not None:
            self.charged -= held[1]
        if cost <= self.budget:
            self._entries[key] = (value, cost)
            self.charged += cost
            while self.charged > self.budget:
                _, (_, freed) = self._entries.popitem(last=False)
                self.charged -= freed
        return value
