"""The upstream Kubernetes binaries that scripts/build-upstream built (pinned in
tests/cluster/upstream/go.mod), for the tests that run one of them."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def upstream_bin() -> Path | None:
    """The folder of the built binaries; None where they are not built here."""
    built = subprocess.run([str(REPO / "scripts" / "build-upstream"), "--print"],
                           capture_output=True, text=True, check=False)
    if built.returncode != 0 or not built.stdout.strip():
        return None
    return Path(built.stdout.strip().splitlines()[-1])


def upstream(name: str) -> Path | None:
    """The built binary ``name`` (kubectl, kube-scheduler, ...); None where it is not built."""
    folder = upstream_bin()
    return folder / name if folder is not None and (folder / name).is_file() else None
