"""The kubelet's projection of a Secret volume, as the webhook pods see it.

Like the kubelet's atomic writer: each new version of the Secret goes into a
fresh timestamped directory, the ``..data`` symlink is swapped to it with one
rename, and the visible files are symlinks through ``..data``. Only the keys
the Deployment mounts (``tls.crt``, ``tls.key``) are projected, each version
after a delay, as the kubelet's sync period would.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from pathlib import Path

from tests.deploy.fake_apiserver import FakeApiServer

KEYS = ("tls.crt", "tls.key")


class SecretProjection:
    """A thread that mirrors one Secret of a `FakeApiServer` into ``directory``."""

    def __init__(self, api: FakeApiServer, secret_path: str, directory: Path,
                 delay: float) -> None:
        self._api, self._path, self.directory, self._delay = api, secret_path, directory, delay
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.swaps = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        projected: dict[str, bytes] = {}
        while not self._stop.wait(0.05):
            secret = self._api.get(self._path)
            if secret is None:
                continue
            data = {k: base64.b64decode(secret["data"][k]) for k in KEYS}
            if data != projected:
                time.sleep(self._delay)
                self._swap(data)
                projected = data

    def _swap(self, data: dict[str, bytes]) -> None:
        version = self.directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{self.swaps}"
        version.mkdir()
        for key, content in data.items():
            (version / key).write_bytes(content)
        link = self.directory / "..data_tmp"
        os.symlink(version.name, link)
        os.rename(link, self.directory / "..data")
        for key in data:
            visible = self.directory / key
            if not visible.is_symlink():
                os.symlink(f"..data/{key}", visible)
        self.swaps += 1
