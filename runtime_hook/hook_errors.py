"""The errors of runtime_hook (the hook, the node agent, vcuda-run): their root, and the hook's.

Also the shape of every vcuda error, :class:`VcudaError`, which the contract exports: it lives
here so that poststop, which reads no contract, loads only this small module.

Every error the package raises on purpose is a :class:`NodeError`: its message
says what went wrong, its ``fix`` what to do. Classes that callers catch as a
built-in error (``ValueError`` for bad input, ``RuntimeError`` for a failed
operation) derive from that too. The hook's failure, :class:`HookError`, is the
one line a user reads in the pod's events.
"""

from __future__ import annotations


class VcudaError(Exception):
    """What went wrong (the message) and how to fix it (``fix``): the shape of vcuda's errors.

    Exported by :mod:`runtime_hook.contract`, which every component imports it from.

    Each package has one root below this one: ``runtime_hook.hook_errors.NodeError``,
    ``webhook.errors.WebhookError``, ``extender.errors.ExtenderError`` and
    ``demo.steps.DemoError``. A class may set the ``fix``
    that fits all its errors; a raise may give its own.
    """

    fix = ""

    def __init__(self, message: str = "", fix: str = "") -> None:
        super().__init__(message)
        if fix:
            self.fix = fix


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
