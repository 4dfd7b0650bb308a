"""The hook's one failure type: a cause and a fix that the user reads in the pod's events."""

from __future__ import annotations


class HookError(Exception):
    """Why the hook refused to let a container start, and what to do about it."""

    def __init__(self, cause: str, fix: str = "", container: str = "") -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix
        self.container = container  # who it is about, once known

    def line(self) -> str:
        """The single stderr line: ``vcuda-hook: container <c>: <cause>; fix: <fix>``."""
        where = f"container {self.container}: " if self.container else ""
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"vcuda-hook: {where}{self.cause}{fix}".replace("\n", " ")
