"""A fake API server with nodes and pods, and an extender serving against it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.extender.cluster import RunningExtender
from tests.fake_cluster_api import FakeClusterApi, running


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeClusterApi]:
    with running(tmp_path) as server:
        yield server


@pytest.fixture
def extender(api: FakeClusterApi, tmp_path: Path) -> Iterator[RunningExtender]:
    running = RunningExtender(api, tmp_path / "extender.log")
    yield running
    running.stop()
