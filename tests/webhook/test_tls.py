"""The serving certificate: checked before use, reloaded live, a bad pair never served."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.webhook.builders import pod, review, shared
from tests.webhook.conftest import RunningServer, SecretVolume, serving_pair, start_server
from webhook.logs import make_logger
from webhook.pki import KeyPair, make_ca
from webhook.tls import CertificateError, CertificateReloader, check_pair

NOW = datetime.now(timezone.utc)


# --- check_pair ------------------------------------------------------------------------------

def test_a_good_pair_is_described_by_subject_serial_and_expiry(ca: KeyPair) -> None:
    pair = serving_pair(ca)
    checked = check_pair(pair.certificate_pem, pair.key_pem, NOW)
    assert checked.subject == "CN=localhost"
    assert checked.serial == f"{pair.certificate.serial_number:x}"
    assert checked.not_after == pair.certificate.not_valid_after_utc


def test_a_chain_with_an_intermediate_is_accepted_by_its_first_certificate(ca: KeyPair) -> None:
    pair = serving_pair(ca)
    chain = pair.certificate_pem + ca.certificate_pem
    assert check_pair(chain, pair.key_pem, NOW).subject == "CN=localhost"


@pytest.mark.parametrize(("make", "message"), [
    (lambda ca, pair, other: (pair.certificate_pem, other.key_pem),
     "the key does not belong to certificate CN=localhost"),
    (lambda ca, pair, other: (b"-----BEGIN CERTIFICATE-----\nnope\n", pair.key_pem),
     "the certificate file holds no PEM certificate"),
    (lambda ca, pair, other: (pair.certificate_pem, b""),
     "the key file holds no PEM private key"),
    (lambda ca, pair, other: (pair.certificate_pem, pair.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"))),
     "the key file holds an encrypted key; give it unencrypted"),
    (lambda ca, pair, other: (pair.key_pem, pair.certificate_pem),
     "the certificate file holds no PEM certificate"),
], ids=["mismatched", "bad-cert", "empty-key", "encrypted-key", "swapped-files"])
def test_a_bad_pair_is_refused_with_the_reason(ca: KeyPair, make: Callable[..., Any],
                                               message: str) -> None:
    chain, key = make(ca, serving_pair(ca), serving_pair(ca))
    with pytest.raises(CertificateError, match=message):
        check_pair(chain, key, NOW)


def test_an_expired_certificate_is_refused(ca: KeyPair) -> None:
    old = serving_pair(ca, starts=timedelta(days=-10), valid_for=timedelta(days=1))
    with pytest.raises(CertificateError, match="certificate CN=localhost expired at"):
        check_pair(old.certificate_pem, old.key_pem, NOW)


# --- the reloader on its own -----------------------------------------------------------------

class Log:
    """The reloader's log as parsed JSON lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stream = path.open("ab")
        self.logger = make_logger(self.stream)

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.path.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == name]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    opened = Log(tmp_path / "reloader.log")
    yield opened
    opened.stream.close()


def test_a_changed_pair_is_used_once_two_polls_read_it_alike(secret: SecretVolume, ca: KeyPair,
                                                             log: Log) -> None:
    reloader = CertificateReloader(secret.cert_file, secret.key_file, log.logger)
    assert reloader.poll() is False  # nothing changed
    new = serving_pair(ca)
    secret.write_pair(new)
    assert reloader.poll() is False  # seen once: the writer may not have finished
    assert reloader.poll() is True
    assert reloader.current.serial == f"{new.certificate.serial_number:x}"
    assert [e["serial"] for e in log.events("certificate_reloaded")] == [reloader.current.serial]


def test_a_bad_pair_keeps_the_old_one_and_is_logged_once(secret: SecretVolume, ca: KeyPair,
                                                         log: Log) -> None:
    reloader = CertificateReloader(secret.cert_file, secret.key_file, log.logger)
    serving = reloader.current
    secret.write(serving_pair(ca).certificate_pem, serving.key_pem)
    assert [reloader.poll() for _ in range(5)] == [False] * 5
    assert reloader.current == serving
    (rejected,) = log.events("certificate_rejected")
    assert rejected["level"] == "error"
    assert rejected["reason"] == "the key does not belong to certificate CN=localhost"
    assert rejected["still_serving"] == serving.serial


def test_missing_files_keep_the_old_pair(secret: SecretVolume, log: Log) -> None:
    reloader = CertificateReloader(secret.cert_file, secret.key_file, log.logger)
    secret.key_file.unlink()
    assert [reloader.poll() for _ in range(3)] == [False] * 3
    (rejected,) = log.events("certificate_rejected")
    assert rejected["reason"] == f"cannot read {secret.key_file}: No such file or directory"


def test_a_bad_pair_at_start_is_an_error_naming_the_files(tmp_path: Path, ca: KeyPair,
                                                         log: Log) -> None:
    volume = SecretVolume(tmp_path / "secret")
    old = serving_pair(ca, starts=timedelta(days=-10), valid_for=timedelta(days=1))
    volume.write_pair(old)
    with pytest.raises(CertificateError, match=f"{volume.cert_file} and {volume.key_file}: "
                                               "certificate CN=localhost expired"):
        CertificateReloader(volume.cert_file, volume.key_file, log.logger)


# --- live reload under load ------------------------------------------------------------------

def served_serial(server: RunningServer) -> int:
    """The serial of the certificate a new connection is served."""
    connection = server.connect()
    try:
        connection.connect()
        der = connection.sock.getpeercert(binary_form=True)
    finally:
        connection.close()
    return x509.load_der_x509_certificate(der).serial_number


class Load:
    """Clients sending reviews without pause, on new connections and on one kept alive."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.body = json.dumps(review(pod(shared("train")))).encode()
        self.failures: list[str] = []
        self.answered = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._fresh_connections),
                         threading.Thread(target=self._kept_alive)]
        for thread in self._threads:
            thread.start()

    def _record(self, status: int, body: bytes) -> None:
        with self._lock:
            if status == 200 and json.loads(body)["response"]["allowed"]:
                self.answered += 1
            else:
                self.failures.append(f"{status}: {body[:200]!r}")

    def _fresh_connections(self) -> None:
        while not self._stop.is_set():
            try:
                self._record(*self.server.post(self.body))
            except Exception as exc:  # any failure counts, whatever its kind
                self.failures.append(repr(exc))

    def _kept_alive(self) -> None:
        connection = self.server.connect()
        while not self._stop.is_set():
            try:
                connection.request("POST", "/mutate", self.body,
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                self._record(response.status, response.read())
            except Exception as exc:  # any failure counts, whatever its kind
                self.failures.append(repr(exc))
        connection.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def wait_for(condition: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_certificates_rotate_under_load_with_no_failed_request(
        server: RunningServer, secret: SecretVolume, ca: KeyPair) -> None:
    first = served_serial(server)
    load = Load(server)
    try:
        second = serving_pair(ca)
        secret.write_pair(second)  # the kubelet's ..data swap
        wait_for(lambda: served_serial(server) == second.certificate.serial_number)

        expired = serving_pair(ca, starts=timedelta(days=-10), valid_for=timedelta(days=1))
        bad_pairs = [(serving_pair(ca).certificate_pem, second.key_pem),  # key of another cert
                     (expired.certificate_pem, expired.key_pem),
                     (b"garbage", b"garbage")]
        for count, (cert_pem, key_pem) in enumerate(bad_pairs, 1):
            secret.write(cert_pem, key_pem)
            wait_for(lambda count=count: len(rejections(server)) == count)
            assert served_serial(server) == second.certificate.serial_number

        third = serving_pair(ca)
        secret.write_pair(third)
        wait_for(lambda: served_serial(server) == third.certificate.serial_number)
        time.sleep(0.2)  # keep the load on a little after the last swap
    finally:
        load.stop()
    assert load.failures == []
    assert load.answered > 20
    assert first != second.certificate.serial_number
    reasons = [r["reason"] for r in rejections(server)]
    assert "the key does not belong" in reasons[0]
    assert "expired at" in reasons[1]
    assert reasons[2] == "the certificate file holds no PEM certificate"


def test_files_rewritten_in_place_are_reloaded(tmp_path: Path, ca: KeyPair, log: Log) -> None:
    """Not every writer uses the ..data swap: a plain rewrite of both files works too."""
    plain = tmp_path / "plain"
    plain.mkdir()
    cert_file, key_file = plain / "tls.crt", plain / "tls.key"
    first, second = serving_pair(ca), serving_pair(ca)
    cert_file.write_bytes(first.certificate_pem)
    key_file.write_bytes(first.key_pem)
    reloader = CertificateReloader(cert_file, key_file, log.logger)
    cert_file.write_bytes(second.certificate_pem)
    assert reloader.poll() is False
    key_file.write_bytes(second.key_pem)
    assert [reloader.poll(), reloader.poll()] == [False, True]
    assert reloader.current.serial == f"{second.certificate.serial_number:x}"
    assert log.events("certificate_rejected") == []


def rejections(server: RunningServer) -> list[dict[str, Any]]:
    return [e for e in server.logs(seconds=0) if e["event"] == "certificate_rejected"]


def test_readyz_fails_once_the_served_certificate_has_expired(tmp_path: Path) -> None:
    ca = make_ca("short-lived CA")
    volume = SecretVolume(tmp_path / "secret")
    pair = serving_pair(ca, starts=timedelta(seconds=-1), valid_for=timedelta(seconds=5))
    volume.write_pair(pair)
    # A probe does not verify the certificate, and this one will expire.
    probe = ssl.create_default_context()
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    running = start_server(volume, probe, tmp_path / "log")
    try:
        assert running.request("GET", "/readyz")[0] == 200
        left = (pair.certificate.not_valid_after_utc - datetime.now(timezone.utc))
        time.sleep(left.total_seconds() + 0.2)
        assert running.request("GET", "/readyz") == (503, b"the serving certificate has expired\n")
        assert running.request("GET", "/healthz") == (200, b"ok\n")
    finally:
        running.stop()
