"""Reading the JSON log of a process that may still be writing it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def written_entries(log: Path) -> list[dict[str, Any]]:
    """The entries of the lines written so far: a last line without its
    newline is still being written, and is read on a later look."""
    text = log.read_text()
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line]
