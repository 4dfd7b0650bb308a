"""What the certificate tool sees: the webhook Secret's material and records, and the CA trust."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
RECORD_ANNOTATION = "certs.vcuda.io/record"


@dataclass(frozen=True)
class Ca:
    """One CA certificate of the trust bundle."""

    fingerprint: str
    not_before: datetime
    not_after: datetime
    pem: bytes


@dataclass(frozen=True)
class Serving:
    """The serving certificate held in the Secret."""

    fingerprint: str
    not_before: datetime
    not_after: datetime
    dns_names: frozenset[str]
    issuer: str | None  # fingerprint of the bundle CA that signed it, if any did


@dataclass(frozen=True)
class Record:
    """The tool's own bookkeeping, kept in an annotation of the Secret.

    Attributes:
        serving_since: (fingerprint, time) the serving certificate was written.
        trusted_since: per CA fingerprint, when the tool saw it in every
            caBundle of the webhook configuration.
    """

    serving_since: tuple[str, datetime] | None = None
    trusted_since: Mapping[str, datetime] = field(default_factory=dict)

    def to_json(self) -> str:
        """The annotation value."""
        doc: dict[str, Any] = {
            "trustedSince": {fp: t.isoformat() for fp, t in sorted(self.trusted_since.items())},
        }
        if self.serving_since:
            doc["servingSince"] = {"fingerprint": self.serving_since[0],
                                   "at": self.serving_since[1].isoformat()}
        return json.dumps(doc, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Record:
        """Parse the annotation; anything unreadable counts as no record (the safe reading)."""
        try:
            doc = json.loads(text or "{}")
            trusted = {fp: _aware(datetime.fromisoformat(t))
                       for fp, t in doc.get("trustedSince", {}).items()}
            since = doc.get("servingSince")
            serving = (since["fingerprint"], _aware(datetime.fromisoformat(since["at"]))) \
                if since else None
        except (ValueError, TypeError, KeyError, AttributeError):
            return cls()
        return cls(serving, trusted)


@dataclass(frozen=True)
class Observed:
    """Everything the plan needs, as plain facts.

    Attributes:
        secret_exists: whether the webhook Secret exists.
        bundle: the Secret's trust bundle (``ca.crt``), in order.
        signing_ca: the bundle CA whose key is ``ca.key``; None if there is none.
        ca_problem: why there is no usable signing CA.
        serving: the Secret's serving certificate; None if missing or unreadable.
        serving_problem: why the serving pair cannot be served, if it cannot.
        record: the tool's bookkeeping from the Secret.
        webhook_trusts: CA fingerprints present in every caBundle of the
            webhook configuration.
        webhook_in_sync: every caBundle equals the Secret's ``ca.crt`` byte for byte.
    """

    secret_exists: bool
    bundle: tuple[Ca, ...] = ()
    signing_ca: Ca | None = None
    ca_problem: str | None = None
    serving: Serving | None = None
    serving_problem: str | None = None
    record: Record = field(default_factory=Record)
    webhook_trusts: frozenset[str] = frozenset()
    webhook_in_sync: bool = False

    @property
    def serving_since(self) -> datetime | None:
        """When the current serving certificate was written, if the record says so."""
        since = self.record.serving_since
        if since and self.serving and since[0] == self.serving.fingerprint:
            return since[1]
        return None

    def trusted_since(self, fingerprint: str) -> datetime | None:
        """When the API server was given this CA, if it still has it."""
        if fingerprint not in self.webhook_trusts:
            return None
        return self.record.trusted_since.get(fingerprint)


def observe(secret: Mapping[str, Any] | None, webhook_config: Mapping[str, Any]) -> Observed:
    """Turn the Secret (None if missing) and the webhook configuration into facts."""
    bundles = ca_bundles(webhook_config)
    trusts = frozenset.intersection(*(frozenset(c.fingerprint for c in parse_bundle(b))
                                      for b in bundles)) if bundles else frozenset()
    if secret is None:
        return Observed(secret_exists=False, webhook_trusts=trusts)
    data = secret_data(secret)
    bundle = parse_bundle(data.get(CA_CERT, b""))
    signing, ca_problem = _signing_ca(bundle, data.get(CA_KEY))
    serving, serving_problem = _serving(bundle, data.get(TLS_CERT), data.get(TLS_KEY))
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    return Observed(
        secret_exists=True,
        bundle=bundle,
        signing_ca=signing,
        ca_problem=ca_problem,
        serving=serving,
        serving_problem=serving_problem,
        record=Record.from_json(annotations.get(RECORD_ANNOTATION)),
        webhook_trusts=trusts,
        webhook_in_sync=bool(bundles) and all(b == data.get(CA_CERT) for b in bundles),
    )


def secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """The Secret's data, base64-decoded."""
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def ca_bundles(webhook_config: Mapping[str, Any]) -> list[bytes]:
    """The decoded caBundle of each webhook of the configuration (empty bytes where unset)."""
    return [base64.b64decode((w.get("clientConfig") or {}).get("caBundle") or "")
            for w in webhook_config.get("webhooks") or []]


def parse_bundle(pem: bytes) -> tuple[Ca, ...]:
    """The CA certificates of a PEM bundle; an unreadable bundle gives none."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:
        return ()
    return tuple(Ca(fingerprint(c), c.not_valid_before_utc, c.not_valid_after_utc,
                    c.public_bytes(serialization.Encoding.PEM)) for c in certificates)


def fingerprint(certificate: x509.Certificate) -> str:
    """SHA-256 of the certificate's DER, in hex: how the tool names certificates."""
    return hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()


def _signing_ca(bundle: tuple[Ca, ...], key_pem: bytes | None) -> tuple[Ca | None, str | None]:
    if not bundle:
        return None, f"{CA_CERT} holds no readable CA certificate"
    if not key_pem:
        return None, f"{CA_KEY} is missing"
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return None, f"{CA_KEY} is not a readable unencrypted private key"
    for ca in bundle:
        if x509.load_pem_x509_certificate(ca.pem).public_key() == key.public_key():
            return ca, None
    return None, f"{CA_KEY} belongs to no CA of {CA_CERT}"


def _serving(bundle: tuple[Ca, ...], cert_pem: bytes | None,
             key_pem: bytes | None) -> tuple[Serving | None, str | None]:
    if not cert_pem or not key_pem:
        return None, f"{TLS_CERT} or {TLS_KEY} is missing"
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return None, f"{TLS_CERT} or {TLS_KEY} is unreadable"
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names = frozenset(san.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = frozenset()
    serving = Serving(fingerprint(certificate), certificate.not_valid_before_utc,
                      certificate.not_valid_after_utc, names, _issuer(bundle, certificate))
    if certificate.public_key() != key.public_key():
        return serving, f"{TLS_KEY} does not belong to {TLS_CERT}"
    if serving.issuer is None:
        return serving, f"{TLS_CERT} is signed by no CA of {CA_CERT}"
    return serving, None


def _issuer(bundle: tuple[Ca, ...], certificate: x509.Certificate) -> str | None:
    for ca in bundle:
        try:
            certificate.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.pem))
        except (ValueError, TypeError, InvalidSignature):
            continue
        return ca.fingerprint
    return None


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("time without a zone")
    return moment
