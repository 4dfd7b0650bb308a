"""The errors of runtime_hook (the hook, the node agent, vcuda-run): their root, and the hook's.

Every error the package raises on purpose is a :class:`NodeError`: its message
says what went wrong, its ``fix`` what to do. Classes that callers catch as a
built-in error (``ValueError`` for bad input, ``RuntimeError`` for a failed
operation) derive from that too. The hook's failure, :class:`HookError`, is the
one line a user reads in the pod's events.
"""

from __future__ import annotations

from runtime_hook.contract import VcudaError


class NodeError(VcudaError):
    """Root of runtime_hook's errors: what went wrong (the message) and how to fix it (``fix``)."""


class UsageError(NodeError, ValueError):
    """A command line (the hook's, ``vcuda-run``'s) is wrong; the message says what to write."""


class HookError(NodeError):
    """Why the hook refused to let a container start, and what to do about it."""

    def __init__(self, cause: str, fix: str = "", container: str = "") -> None:
        super().__init__(cause, fix)
        self.cause = cause
        self.container = container  # who it is about, once known

    def line(self) -> str:
        """The single stderr line: ``vcuda-hook: container <c>: <cause>; fix: <fix>``."""
        where = f"container {self.container}: " if self.container else ""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"vcuda-hook: {where}{self.cause}{fix}".replace("\n", " ")
