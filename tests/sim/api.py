"""The simulated cluster's API server (:class:`~tests.fake_cluster_api.FakeClusterApi`) in a
process of its own, as kube-apiserver is apart from kube-scheduler: its threads serving the
extenders, the node agents and the device plugins do not hold the scheduler's interpreter lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.fake_cluster_api import FakeClusterApi
from tests.sim import apart


def _started(cert_dir: str) -> FakeClusterApi:
    api = FakeClusterApi()
    api.start(Path(cert_dir))
    return api


apart.Manager.register("FakeClusterApi", _started)


@contextmanager
def started(root: Path) -> Iterator[tuple[Any, int]]:
    """The API server's process, its server started with its TLS files in ``root``: (a proxy
    of its :class:`FakeClusterApi`, the process's pid); stopped and ended afterwards."""
    with apart.process(root, "api") as (manager, pid):
        api = manager.FakeClusterApi(str(root))  # type: ignore[attr-defined]
        try:
            yield api, pid
        finally:
            api.stop()
