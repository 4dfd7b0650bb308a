"""Rotating the CA and the serving certificate under load: the real webhook never fails a request.

The real `vcuda-webhook` serves from a directory that `SecretProjection`
keeps in step with the Secret (kubelet-style ``..data`` swap, with a delay).
A client plays the API server: for every request it opens a new TLS
connection, verifying the service name against whatever caBundle the tool
last wrote into the webhook configuration. Meanwhile `vcuda-certs` rotates
the CA and then renews the serving certificate.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.deploy.fake_apiserver import FakeApiServer
from tests.deploy.manifests import find
from tests.deploy.projection import SecretProjection
from tests.deploy.test_certs_cli import MWC, SECRET
from tests.deploy.world import SERVICE_NAMES
from webhook.certs.cli import main as certs

PROJECTION_DELAY = 0.4  # the kubelet's sync, shortened
RELOAD_INTERVAL = 0.2   # the webhook checks its files this often (and wants two equal reads)
PROPAGATION = "3"       # seconds: comfortably above delay + two reload polls

REVIEW = json.dumps({
    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
    "request": {
        "uid": "0d6b1d4c-2a43-4a55-9bb0-5f2f1f1f0001",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "default", "operation": "CREATE",
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
                   "spec": {"containers": [{"name": "main", "image": "pytorch", "resources": {
                       "limits": {"docker.com/vcuda-core": "30",
                                  "docker.com/vcuda-memory": "40"}}}]}},
    },
}).encode()


@dataclass
class Load:
    """Requests made by the client, and what it saw."""

    ok: int = 0
    failures: list[str] = field(default_factory=list)
    served: set[str] = field(default_factory=set)  # fingerprints of the certificates seen


def _request(port: int, bundle: bytes) -> str:
    """One review over a fresh TLS connection; the served certificate's fingerprint."""
    context = ssl.create_default_context(cadata=bundle.decode())
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=SERVICE_NAMES[0]) as tls:
        tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: " + SERVICE_NAMES[0].encode() +
                    b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    b"Content-Length: " + str(len(REVIEW)).encode() + b"\r\n\r\n" + REVIEW)
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.split(b"\r\n")[0].decode())
        if not json.loads(body)["response"]["allowed"]:
            raise RuntimeError("review not allowed")
        return hashlib.sha256(tls.getpeercert(binary_form=True) or b"").hexdigest()


def _keep_requesting(api: FakeApiServer, port: int, load: Load, stop: threading.Event) -> None:
    while not stop.is_set():
        mwc = api.get(MWC)
        assert mwc is not None
        bundle = base64.b64decode(mwc["webhooks"][0]["clientConfig"]["caBundle"])
        try:
            load.served.add(_request(port, bundle))
            load.ok += 1
        except (OSError, RuntimeError, ValueError) as error:
            load.failures.append(f"{time.monotonic():.2f} {error}")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path, int]]:
    """The fake API server, ensure's certificates projected, and the webhook serving them."""
    api = FakeApiServer()
    api.start(tmp_path)
    api.put(MWC, find("MutatingWebhookConfiguration", "vcuda-webhook"))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig())
    volume = tmp_path / "tls"
    volume.mkdir()
    projection = SecretProjection(api, SECRET, volume, PROJECTION_DELAY)
    projection.start()
    assert certs(["ensure", "--kubeconfig", str(kubeconfig)]) == 0
    deadline = time.monotonic() + 10
    while projection.swaps == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "webhook.server", "--host", "127.0.0.1", "--port", str(port),
         "--cert-file", str(volume / "tls.crt"), "--key-file", str(volume / "tls.key"),
         "--reload-interval", str(RELOAD_INTERVAL)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_until_serving(port, server)
        yield api, kubeconfig, port
    finally:
        server.terminate()
        server.wait(timeout=15)
        projection.stop()
        api.stop()


def _wait_until_serving(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the webhook exited: {server.stderr.read().decode()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the webhook did not start listening within 30 s")


def _under_load(api: FakeApiServer, port: int, *runs: list[str]) -> Load:
    load, stop = Load(), threading.Event()
    client = threading.Thread(target=_keep_requesting, args=(api, port, load, stop))
    client.start()
    try:
        for argv in runs:
            assert certs(argv) == 0
        time.sleep(float(PROPAGATION))  # the last change reaches the server under load too
    finally:
        stop.set()
        client.join()
    return load


def test_rotating_the_ca_then_the_serving_certificate_fails_no_request(
        stack: tuple[FakeApiServer, Path, int]) -> None:
    api, kubeconfig, port = stack
    common = ["--kubeconfig", str(kubeconfig), "--propagation", PROPAGATION, "--max-wait", "60"]
    load = _under_load(api, port, ["rotate", "--renew-ca", *common],
                       ["rotate", "--renew-serving", *common])
    assert load.failures == []
    assert load.ok > 50
    # Served: the first certificate, the one signed by the new CA, and the renewed one.
    assert len(load.served) == 3


def test_the_check_would_see_failures_if_the_old_ca_left_too_early(
        stack: tuple[FakeApiServer, Path, int]) -> None:
    api, kubeconfig, port = stack
    # With no propagation time, caBundle moves ahead of what the pods serve.
    load = _under_load(api, port, ["rotate", "--renew-ca", "--kubeconfig", str(kubeconfig),
                                   "--propagation", "0"])
    assert load.failures, "requests should fail while the pods still serve the old certificate"
    assert any("CERTIFICATE_VERIFY_FAILED" in f for f in load.failures)
