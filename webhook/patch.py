"""JSON Patch (RFC 6902) operations built one at a time."""

from __future__ import annotations

from typing import Any

Operation = dict[str, Any]


class PatchBuilder:
    """Collects the operations that turn a document into the wanted one.

    Each method is told the current value and adds an operation only where the
    document differs, so a document that is already right yields no patch.
    """

    def __init__(self) -> None:
        self.operations: list[Operation] = []

    def add(self, path: str, value: Any) -> None:
        """Add ``value`` at ``path``, where nothing is yet (e.g. a whole new object)."""
        self.operations.append({"op": "add", "path": path, "value": value})

    def put(self, path: str, current: Any, wanted: Any) -> None:
        """Make the member at ``path``, in an object that exists, equal ``wanted``.

        Args:
            path: the member's JSON Pointer.
            current: the member's value now; None when there is none.
            wanted: the value it must have.
        """
        if current is None:
            self.add(path, wanted)
        elif current != wanted:
            self.operations.append({"op": "replace", "path": path, "value": wanted})

    def remove(self, path: str) -> None:
        """Remove the member at ``path``, which exists."""
        self.operations.append({"op": "remove", "path": path})
