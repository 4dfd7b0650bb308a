"""A small certificate authority: ECDSA P-256 CA and serving certificates, PEM in and out.

The tests, the local development server and the certificate tools all issue
certificates through this module, so they agree on what a serving certificate
for the webhook looks like.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Issued certificates start this far in the past, so that a verifier whose
# clock is slightly behind the issuer's accepts them at once.
CLOCK_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def certificate_pem(self) -> bytes:
        """The certificate in PEM."""
        return certificate_to_pem(self.certificate)

    @property
    def key_pem(self) -> bytes:
        """The private key in unencrypted PKCS#8 PEM."""
        return private_key_to_pem(self.key)


def make_ca(common_name: str = "vcuda webhook CA", not_before: datetime | None = None,
            not_after: datetime | None = None) -> KeyPair:
    """Create a self-signed CA that may sign serving certificates (path length 0).

    Args:
        common_name: the CA's subject CN.
        not_before: start of validity; default now minus CLOCK_SKEW.
        not_after: end of validity; default ten years after ``not_before``.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or _now() - CLOCK_SKEW
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(not_after or start + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(certificate, key)


def issue_serving_cert(ca: KeyPair, dns_names: Sequence[str], not_before: datetime,
                       not_after: datetime, ip_addresses: Sequence[str] = ()) -> KeyPair:
    """Issue a TLS server certificate signed by ``ca`` with a fresh key.

    Args:
        ca: the issuing CA.
        dns_names: DNS subject alternative names; the first is also the CN.
            For a webhook: ``<service>.<namespace>.svc``.
        not_before: start of validity.
        not_after: end of validity.
        ip_addresses: IP subject alternative names, e.g. ``["127.0.0.1"]``.
    """
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    common_name = dns_names[0] if dns_names else ip_addresses[0]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return KeyPair(certificate, key)


def certificate_to_pem(certificate: x509.Certificate) -> bytes:
    """Return ``certificate`` in PEM."""
    return certificate.public_bytes(serialization.Encoding.PEM)


def private_key_to_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """Return ``key`` in unencrypted PKCS#8 PEM."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def load_key_pair(certificate_pem: bytes, key_pem: bytes) -> KeyPair:
    """Load a CA (or any certificate and EC key) from PEM, e.g. from a Secret."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("the key is not an elliptic-curve key")
    return KeyPair(x509.load_pem_x509_certificate(certificate_pem), key)


def _key_usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
        crl_sign=cert_sign, encipher_only=False, decipher_only=False)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def write_self_signed(directory: Path) -> tuple[Path, Path, Path]:
    """Write a throwaway CA and a localhost serving certificate; return (ca, cert, key) files."""
    now = datetime.now(timezone.utc)
    ca = make_ca("vcuda-webhook throwaway CA")
    serving = issue_serving_cert(ca, ["localhost"], now - timedelta(minutes=5),
                                 now + timedelta(days=7), ip_addresses=["127.0.0.1", "::1"])
    files = directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
    for path, data in zip(files, (ca.certificate_pem, serving.certificate_pem, serving.key_pem)):
        path.touch(mode=0o600)
        path.write_bytes(data)
    return files
