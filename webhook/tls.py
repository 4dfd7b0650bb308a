"""The serving certificate: checked before use, and reloaded when its files change."""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Union

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from webhook.errors import WebhookError

# What two reads of the certificate and key files gave: their bytes, or why they
# could not be read.
_Snapshot = Union[tuple[bytes, bytes], str]


class CertificateError(WebhookError, ValueError):
    """A certificate/key pair that must not be served; the message says why."""


@dataclass(frozen=True)
class ServingCertificate:
    """A checked certificate chain and its key, ready to load into an SSLContext."""

    chain_pem: bytes
    key_pem: bytes
    subject: str
    serial: str  # hexadecimal, as openssl prints it
    not_before: datetime
    not_after: datetime


def check_pair(chain_pem: bytes, key_pem: bytes, now: datetime) -> ServingCertificate:
    """Check that the PEM chain and key parse, belong together and have not expired.

    Args:
        chain_pem: the serving certificate first, then any intermediates.
        key_pem: the unencrypted private key of the first certificate.
        now: the time to check expiry against.
    """
    try:
        chain = x509.load_pem_x509_certificates(chain_pem)
    except ValueError:
        raise CertificateError("the certificate file holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise CertificateError("the key file holds an encrypted key; give it unencrypted") \
            from None
    except (ValueError, UnsupportedAlgorithm):
        raise CertificateError("the key file holds no PEM private key") from None
    leaf = chain[0]
    subject = leaf.subject.rfc4514_string()
    if _public_der(leaf.public_key()) != _public_der(key.public_key()):
        raise CertificateError(f"the key does not belong to certificate {subject}")
    if leaf.not_valid_after_utc <= now:
        raise CertificateError(f"certificate {subject} expired at "
                               f"{leaf.not_valid_after_utc.isoformat()}")
    return ServingCertificate(chain_pem, key_pem, subject, f"{leaf.serial_number:x}",
                              leaf.not_valid_before_utc, leaf.not_valid_after_utc)


class CertificateReloader:
    """Owns the server's SSLContext and swaps in a new certificate when the files change.

    The files are compared by content, so a rename, a rewrite and Kubernetes'
    swap of the ``..data`` symlink of a Secret volume are all seen. A changed
    pair is used once two polls in a row read the same bytes (a writer that
    replaces the files one by one has then finished), and only if
    ``check_pair`` accepts it; otherwise the old certificate keeps serving and
    the reason is logged once.
    """

    def __init__(self, cert_file: Path, key_file: Path, log: Any) -> None:
        """Load and check the pair; raise CertificateError naming the files if it is bad."""
        self._files = (cert_file, key_file)
        self._log = log
        snapshot = self._read()
        if isinstance(snapshot, str):
            raise CertificateError(snapshot)
        try:
            self.current = check_pair(*snapshot, _now())
        except CertificateError as exc:
            raise CertificateError(f"{cert_file} and {key_file}: {exc}") from None
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._install(self.current)
        self._served = snapshot
        self._pending: _Snapshot | None = None
        self._rejected: _Snapshot | None = None
        log.info("certificate_loaded", **self._describe(self.current))

    def seconds_left(self) -> float:
        """Seconds until the certificate being served expires."""
        return (self.current.not_after - _now()).total_seconds()

    def poll(self) -> bool:
        """Look at the files once; return True if a new certificate is now served."""
        snapshot = self._read()
        if snapshot == self._served:
            self._pending = None
            return False
        if snapshot != self._pending:
            self._pending = snapshot
            return False
        if snapshot == self._rejected:
            return False
        try:
            if isinstance(snapshot, str):
                raise CertificateError(snapshot)
            new = check_pair(*snapshot, _now())
        except CertificateError as exc:
            self._rejected = snapshot
            self._log.error("certificate_rejected", reason=str(exc),
                            cert_file=str(self._files[0]), key_file=str(self._files[1]),
                            still_serving=self.current.serial)
            return False
        self._install(new)
        self.current, self._served = new, snapshot
        self._log.info("certificate_reloaded", **self._describe(new))
        return True

    async def watch(self, interval: float) -> None:
        """Poll every ``interval`` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.poll()

    def _read(self) -> _Snapshot:
        try:
            return self._files[0].read_bytes(), self._files[1].read_bytes()
        except OSError as exc:
            return f"cannot read {exc.filename}: {exc.strerror}"

    def _install(self, certificate: ServingCertificate) -> None:
        # The checked bytes are loaded, not the files again: they may have
        # changed since. An anonymous memory file keeps the key off disk.
        fd = os.memfd_create("vcuda-webhook-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, certificate.chain_pem + b"\n" + certificate.key_pem)
            # New connections take the new chain; open ones keep theirs.
            self.context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)

    def _describe(self, certificate: ServingCertificate) -> dict[str, Any]:
        details = {"subject": certificate.subject, "serial": certificate.serial,
                   "not_after": certificate.not_after.isoformat()}
        if certificate.not_before > _now():
            details["warning"] = (f"not valid before {certificate.not_before.isoformat()}; "
                                  "clients reject it until then")
        return details


def _public_der(public_key: Any) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)


def _now() -> datetime:
    return datetime.now(timezone.utc)
