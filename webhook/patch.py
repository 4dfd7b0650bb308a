"""JSON Patch (RFC 6902) operations built one at a time, with RFC 6901 pointers."""

from __future__ import annotations

from typing import Any

Operation = dict[str, Any]


def escape(token: str) -> str:
    """Escape one reference token of a JSON Pointer (``nvidia.com/gpu`` -> ``nvidia.com~1gpu``)."""
    return token.replace("~", "~0").replace("/", "~1")


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

    def put(self, parent_path: str, key: str, current: Any, wanted: Any) -> None:
        """Make member ``key`` of the object at ``parent_path`` equal ``wanted``.

        Args:
            parent_path: JSON Pointer of an object that exists.
            key: the member's name, unescaped.
            current: the member's value now; None when there is none.
            wanted: the value it must have.
        """
        if current is None:
            self.add(f"{parent_path}/{escape(key)}", wanted)
        elif current != wanted:
            self.operations.append({"op": "replace", "path": f"{parent_path}/{escape(key)}",
                                    "value": wanted})

    def remove(self, parent_path: str, key: str) -> None:
        """Remove member ``key``, which exists, of the object at ``parent_path``."""
        self.operations.append({"op": "remove", "path": f"{parent_path}/{escape(key)}"})
