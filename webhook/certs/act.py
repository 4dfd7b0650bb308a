"""Carries out one step of the plan: builds the new Secret or caBundle and writes it."""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from webhook import pki
from webhook.certs.observe import (
    CA_CERT,
    CA_KEY,
    RECORD_ANNOTATION,
    TLS_CERT,
    TLS_KEY,
    Ca,
    Observed,
    Record,
    ca_bundles,
    fingerprint,
    parse_bundle,
    secret_data,
)
from webhook.certs.plan import (
    Action,
    Bootstrap,
    IntroduceCa,
    IssueServing,
    RecordServing,
    RetireCas,
    TrustBundle,
)


class Clock(Protocol):
    """Time as the tool sees it; tests pass one they move by hand."""

    def now(self) -> datetime: ...
    def sleep(self, seconds: float) -> None: ...


class Writer(Protocol):
    """The writes a step needs (`cluster.Cluster` or its dry-run stand-in)."""

    def create_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]: ...
    def replace_secret(self, secret: Mapping[str, Any]) -> dict[str, Any]: ...
    def write_ca_bundle(self, config: Mapping[str, Any], bundle: bytes) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Issuing:
    """How certificates are made.

    Attributes:
        namespace: the Secret's namespace.
        secret: the Secret's name.
        dns_names: SANs of the serving certificate.
        ca_validity: life of a new CA.
        serving_validity: life of a new serving certificate (never past its CA's).
    """

    namespace: str
    secret: str
    dns_names: tuple[str, ...]
    ca_validity: timedelta
    serving_validity: timedelta


def carry_out(action: Action, seen: Observed, secret: Mapping[str, Any] | None,
              config: Mapping[str, Any], issuing: Issuing, writer: Writer,
              clock: Clock) -> dict[str, Any]:
    """Carry out ``action`` (a writing step) and return what to log about it."""
    now = clock.now()
    if isinstance(action, Bootstrap):
        return _bootstrap(action, config, now, issuing, writer, clock)
    assert secret is not None  # every other writing step follows a Bootstrap
    data, record = secret_data(secret), seen.record
    details: dict[str, Any] = {}
    if isinstance(action, IntroduceCa):
        ca = _new_ca(now, issuing)
        data[CA_CERT] = ca.certificate_pem + b"".join(c.pem for c in seen.bundle)
        data[CA_KEY] = ca.key_pem
        details = {"ca": _describe(ca), "reason": action.reason}
    elif isinstance(action, TrustBundle):
        if action.patch_webhook:
            writer.write_ca_bundle(config, data[CA_CERT])
        record = replace(record, trusted_since=dict(action.trusted_since))
        details = {"patched_webhook_config": action.patch_webhook,
                   "trusted_cas": sorted(action.trusted_since)}
    elif isinstance(action, IssueServing):
        assert seen.signing_ca is not None  # the plan issues only with a signing CA
        serving = _new_serving(seen.signing_ca, data[CA_KEY], now, issuing)
        data[TLS_CERT], data[TLS_KEY] = serving.certificate_pem, serving.key_pem
        record = replace(record, serving_since=(fingerprint(serving.certificate), now))
        details = {"serving": _describe(serving), "signed_by": seen.signing_ca.fingerprint,
                   "reason": action.reason}
    elif isinstance(action, RecordServing):
        assert seen.serving is not None
        record = replace(record, serving_since=(seen.serving.fingerprint, now))
    elif isinstance(action, RetireCas):
        data[CA_CERT] = b"".join(c.pem for c in seen.bundle
                                 if c.fingerprint not in action.fingerprints)
        record = replace(record, trusted_since={
            fp: t for fp, t in record.trusted_since.items() if fp not in action.fingerprints})
        details = {"retired_cas": list(action.fingerprints)}
    else:
        raise TypeError(f"{type(action).__name__} writes nothing")
    writer.replace_secret(_secret(issuing, data, record, secret))
    return details


def _bootstrap(action: Bootstrap, config: Mapping[str, Any], now: datetime, issuing: Issuing,
               writer: Writer, clock: Clock) -> dict[str, Any]:
    """New CA and serving pair. The CA joins caBundle, and settles there, before the Secret exists.

    CAs already in caBundle (for instance from a Secret that was deleted) are
    kept in the new bundle, so that webhook pods still serving a certificate
    they signed stay trusted; the plan retires them like any old CA. Waiting
    is not recorded anywhere: a run stopped during it leaves an unused CA in
    caBundle, which the next run keeps and later retires.
    """
    ca = _new_ca(now, issuing)
    kept = {c.fingerprint: c for b in ca_bundles(config) for c in parse_bundle(b)
            if c.not_after > now}
    bundle = ca.certificate_pem + b"".join(c.pem for c in kept.values())
    ca_entry = parse_bundle(ca.certificate_pem)[0]
    serving = _new_serving(ca_entry, ca.key_pem, now, issuing)
    writer.write_ca_bundle(config, bundle)
    clock.sleep(action.settle.total_seconds())
    record = Record(serving_since=(fingerprint(serving.certificate), clock.now()),
                    trusted_since={fp: now for fp in [ca_entry.fingerprint, *kept]})
    data = {CA_CERT: bundle, CA_KEY: ca.key_pem,
            TLS_CERT: serving.certificate_pem, TLS_KEY: serving.key_pem}
    writer.create_secret(_secret(issuing, data, record, None))
    return {"ca": _describe(ca), "serving": _describe(serving), "kept_cas": sorted(kept)}


def _new_ca(now: datetime, issuing: Issuing) -> pki.KeyPair:
    start = now - pki.CLOCK_SKEW
    return pki.make_ca(f"vcuda webhook CA {now:%Y-%m-%d %H:%M:%S}", start,
                       start + issuing.ca_validity)


def _new_serving(signing: Ca, ca_key_pem: bytes, now: datetime,
                 issuing: Issuing) -> pki.KeyPair:
    ca = pki.load_key_pair(signing.pem, ca_key_pem)
    start = now - pki.CLOCK_SKEW
    return pki.issue_serving_cert(ca, issuing.dns_names, start,
                                  min(start + issuing.serving_validity, signing.not_after))


def _secret(issuing: Issuing, data: Mapping[str, bytes], record: Record,
            old: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Secret to write: ``old`` (kept as it is, resourceVersion included) with new data."""
    secret: dict[str, Any] = copy.deepcopy(dict(old)) if old else {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": issuing.secret, "namespace": issuing.namespace,
                     "labels": {"app.kubernetes.io/name": "vcuda-webhook",
                                "app.kubernetes.io/managed-by": "vcuda-certs"}},
    }
    metadata = secret.setdefault("metadata", {})
    metadata.setdefault("annotations", {})[RECORD_ANNOTATION] = record.to_json()
    secret["data"] = {k: base64.b64encode(v).decode() for k, v in sorted(data.items())}
    return secret


def _describe(pair: pki.KeyPair) -> dict[str, str]:
    certificate = pair.certificate
    return {"fingerprint": fingerprint(certificate),
            "not_after": certificate.not_valid_after_utc.isoformat()}
