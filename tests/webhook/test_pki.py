"""The small CA: what a CA and a serving certificate issued by it look like."""

from __future__ import annotations

import ipaddress
from datetime import datetime, timedelta, timezone

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from webhook.pki import CLOCK_SKEW, issue_serving_cert, load_key_pair, make_ca

NOW = datetime.now(timezone.utc).replace(microsecond=0)


def test_a_ca_is_a_p256_ca_that_signs_only_end_certificates() -> None:
    ca = make_ca("test CA")
    cert = ca.certificate
    assert isinstance(ca.key.curve, ec.SECP256R1)
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert cert.subject == cert.issuer
    assert cert.subject.rfc4514_string() == "CN=test CA"
    cert.verify_directly_issued_by(cert)


def test_a_ca_starts_a_little_in_the_past_and_lasts_ten_years_by_default() -> None:
    now = datetime.now(timezone.utc)
    cert = make_ca().certificate
    start = cert.not_valid_before_utc
    assert abs(start - (now - CLOCK_SKEW)) <= timedelta(seconds=2)
    assert cert.not_valid_after_utc - start == timedelta(days=3650)


def test_a_serving_certificate_names_its_hosts_and_is_for_servers_only() -> None:
    ca = make_ca()
    start, end = NOW, NOW + timedelta(days=90)
    pair = issue_serving_cert(ca, ["vcuda-webhook.vcuda-system.svc", "vcuda-webhook"], start,
                              end, ip_addresses=["127.0.0.1", "::1"])
    cert = pair.certificate
    cert.verify_directly_issued_by(ca.certificate)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["vcuda-webhook.vcuda-system.svc",
                                                        "vcuda-webhook"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1"),
                                                         ipaddress.ip_address("::1")]
    assert cert.subject.rfc4514_string() == "CN=vcuda-webhook.vcuda-system.svc"
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert (cert.not_valid_before_utc, cert.not_valid_after_utc) == (start, end)
    assert isinstance(pair.key.curve, ec.SECP256R1)


def test_a_serving_certificate_needs_a_name() -> None:
    with pytest.raises(ValueError, match="at least one DNS name or IP address"):
        issue_serving_cert(make_ca(), [], NOW, NOW + timedelta(days=1))


def test_pem_round_trips_through_load_key_pair() -> None:
    ca = make_ca()
    loaded = load_key_pair(ca.certificate_pem, ca.key_pem)
    assert loaded.certificate == ca.certificate
    assert loaded.key_pem == ca.key_pem
    assert ca.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
