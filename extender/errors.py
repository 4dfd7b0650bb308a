"""The root of the scheduler extender's errors: what went wrong and how to fix it.

Every error the package raises on purpose is an :class:`ExtenderError`; those that
callers catch as a built-in error (``ValueError`` for bad input, ``RuntimeError``
for a failed API call) derive from that too.
"""

from __future__ import annotations

from runtime_hook.contract import VcudaError


class ExtenderError(VcudaError):
    """Root of the extender's errors: what went wrong (the message) and how to fix it (``fix``)."""
