"""Fixtures: a test CA, certificates in a Secret-volume layout, and a real TLS webhook server."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import uvloop

from tests.json_log import written_entries
from webhook.config import Config
from webhook.kube import Credentials
from webhook.logs import make_logger
from webhook.pki import KeyPair, issue_serving_cert, make_ca
from webhook.server import WebhookServer
from webhook.serving import DEFAULT_GUARDS, Guards
from webhook.tls import CertificateReloader

RELOAD_INTERVAL = 0.05


def serving_pair(ca: KeyPair, *, valid_for: timedelta = timedelta(days=30),
                 starts: timedelta = timedelta(minutes=-5)) -> KeyPair:
    """A serving certificate for 127.0.0.1 and localhost."""
    now = datetime.now(timezone.utc)
    return issue_serving_cert(ca, ["localhost"], now + starts, now + starts + valid_for,
                              ip_addresses=["127.0.0.1"])


class SecretVolume:
    """A directory laid out as the kubelet lays out a mounted TLS Secret.

    ``tls.crt`` and ``tls.key`` are links into ``..data``, itself a link to a
    timestamped directory; an update writes a new directory and renames a new
    ``..data`` link over the old one, so both files change in one step.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._generation = 0
        root.mkdir(parents=True, exist_ok=True)

    @property
    def cert_file(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key_file(self) -> Path:
        return self.root / "tls.key"

    def write(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Swap in a new certificate and key as one atomic ``..data`` rename."""
        self._generation += 1
        new = self.root / f"..2024_01_01_00_00_00.{self._generation:06d}"
        new.mkdir()
        (new / "tls.crt").write_bytes(cert_pem)
        (new / "tls.key").write_bytes(key_pem)
        data = self.root / "..data"
        old = data.resolve() if data.exists() else None
        staging = self.root / "..data_tmp"
        staging.symlink_to(new.name)
        os.rename(staging, data)
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")
        if old is not None:
            for child in old.iterdir():
                child.unlink()
            old.rmdir()

    def write_pair(self, pair: KeyPair) -> None:
        self.write(pair.certificate_pem, pair.key_pem)


# The loop vcuda-webhook runs on (its C TLS layer with it), and asyncio's own.
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


class RunningServer:
    """The webhook server on 127.0.0.1, in a thread with its own event loop (uvloop's,
    as in ``vcuda-webhook``, unless ``loop`` names another of LOOPS)."""

    def __init__(self, webhook: WebhookServer, client: ssl.SSLContext, log_file: Path,
                 log_stream: BinaryIO, loop: str = "uvloop") -> None:
        self.client_context = client
        self.log_file = log_file
        self._log_stream = log_stream
        self._webhook = webhook
        self._loop = LOOPS[loop]()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._call(webhook.start("127.0.0.1", 0))

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    def stop(self) -> None:
        self._call(self._webhook.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self._log_stream.close()

    def connect(self) -> http.client.HTTPSConnection:
        """A new TLS connection that trusts only the test CA."""
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.client_context,
                                           timeout=10)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        connection = self.connect()
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def post(self, body: bytes) -> tuple[int, bytes]:
        return self.request("POST", "/mutate", body, {"Content-Type": "application/json"})

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        """POST an AdmissionReview and return its ``response``, which must come with 200."""
        status, body = self.post(json.dumps(review).encode())
        assert status == 200, body
        answer = json.loads(body)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        return answer["response"]

    def logs(self, until: Callable[[list[dict[str, Any]]], bool] = lambda _: True,
             seconds: float = 5) -> list[dict[str, Any]]:
        """The JSON log lines, once ``until`` holds for them (lines may come late)."""
        deadline = time.monotonic() + seconds
        while True:
            entries = written_entries(self.log_file)
            if until(entries) or time.monotonic() > deadline:
                return entries
            time.sleep(0.02)


@pytest.fixture(scope="session")
def ca() -> KeyPair:
    return make_ca("vcuda test CA")


@pytest.fixture
def client_context(ca: KeyPair) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.certificate_pem.decode())


@pytest.fixture
def secret(tmp_path: Path, ca: KeyPair) -> SecretVolume:
    volume = SecretVolume(tmp_path / "secret")
    volume.write_pair(serving_pair(ca))
    return volume


def start_server(secret: SecretVolume, client: ssl.SSLContext, log_file: Path,
                 config: Config | None = None, guards: Guards = DEFAULT_GUARDS,
                 api: Credentials | None = None, nodes_interval: float = 60.0,
                 loop: str = "uvloop") -> RunningServer:
    """The server on a free port; ``api``: where it reads the Nodes' largest GPU share;
    ``loop``: which of LOOPS it runs on."""
    stream = log_file.open("ab")
    log = make_logger(stream)
    certificates = CertificateReloader(secret.cert_file, secret.key_file, log)
    webhook = WebhookServer(config or Config(), certificates, log, RELOAD_INTERVAL, guards, api,
                            nodes_interval)
    return RunningServer(webhook, client, log_file, stream, loop)


@pytest.fixture
def server(secret: SecretVolume, client_context: ssl.SSLContext,
           tmp_path: Path) -> Iterator[RunningServer]:
    running = start_server(secret, client_context, tmp_path / "webhook.log")
    yield running
    running.stop()
