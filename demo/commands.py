"""Where the demo finds vcuda's own commands: the installed console script, else its module."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def vcuda_command(script: str, module: str) -> list[str]:
    """``script`` beside this Python when installed there (a virtual environment), else
    ``python -m module``, the same entry point, for a Python that only has the dependencies."""
    installed = Path(sys.executable).parent / script
    if os.access(installed, os.X_OK):
        return [str(installed)]
    return [sys.executable, "-m", module]
