"""The demo's step runner: runs each step, prints one line for it, and counts what failed."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

from runtime_hook.contract import VcudaError

OK, FAILED, SKIPPED = "ok", "FAILED", "skipped"
_INDENT = " " * 12
_PACKAGE = Path(__file__).resolve().parent


class Done(NamedTuple):
    """What a step that worked did: one line, then any lines that show it."""

    summary: str
    details: Sequence[str] = ()


class DemoError(VcudaError):
    """Root of the demo's errors: what went wrong (the message) and how to fix it (``fix``)."""


class StepFailed(DemoError):
    """A step did not do what it should: what happened, then any lines that show it."""

    def __init__(self, summary: str, details: Sequence[str] = ()) -> None:
        super().__init__(summary)
        self.summary = summary
        self.details = tuple(details)


class StepSkipped(DemoError):
    """A step that cannot run here; the message says why."""


class Runner:
    """Runs steps in order and prints ``<status> <n>. <title>: <what happened>`` for each."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self.statuses: list[str] = []

    def run(self, title: str, action: Callable[[], Done]) -> bool:
        """Run ``action`` as the next step; return whether it did not fail.

        ``action`` returns Done, or raises StepFailed or StepSkipped; any other
        exception is a failure too, shown with where it came from.
        KeyboardInterrupt passes through.
        """
        try:
            done = action()
        except StepSkipped as exc:
            return self._record(SKIPPED, title, str(exc), ())
        except StepFailed as exc:
            return self._record(FAILED, title, exc.summary, exc.details)
        except Exception as exc:
            summary = f"unexpected {type(exc).__name__}: {exc}"
            return self._record(FAILED, title, summary, [_where(exc)])
        return self._record(OK, title, done.summary, done.details)

    def skip(self, title: str, reason: str) -> None:
        """Record a step that is not run, and why (e.g. an earlier step failed)."""
        self._record(SKIPPED, title, reason, ())

    @property
    def failed(self) -> int:
        """How many steps failed."""
        return self.statuses.count(FAILED)

    def print(self, line: str = "") -> None:
        """Print a line that belongs to no step."""
        print(line, file=self._out, flush=True)

    def _record(self, status: str, title: str, summary: str, details: Sequence[str]) -> bool:
        self.statuses.append(status)
        number = len(self.statuses)
        lines = [f"{status:<7} {number:>2}. {title}: {summary}"]
        lines += [_INDENT + line if line else "" for line in details]
        print("\n".join(lines), file=self._out, flush=True)
        return status != FAILED

    def tally(self) -> str:
        """One line: how many steps passed, failed and were skipped."""
        counts = [f"{self.statuses.count(s)} {s.lower()}" for s in (OK, FAILED, SKIPPED)]
        return f"{len(self.statuses)} steps: " + ", ".join(counts)


def _where(exc: Exception) -> str:
    """The line of the step's code (the demo's, else any) that the exception came through last."""
    frames = traceback.extract_tb(exc.__traceback__)[1:]  # [0] is Runner.run
    frame = ([f for f in frames if Path(f.filename).parent == _PACKAGE] or frames)[-1]
    return f"at {Path(frame.filename).name}:{frame.lineno}, in {frame.name}: {frame.line}"
