"""The rotation state machine: from what is observed and the time, the one next step.

Pure: no I/O and no clock of its own, so every step and every point where a
run can be interrupted is tested by calling `decide`.

Why the order of steps keeps the webhook trusted at every moment:

* a CA joins the webhook configuration's caBundle (`TrustBundle`) before
  anything it signs is written to the Secret;
* a serving certificate signed by a new CA is written (`IssueServing`) only
  once that CA has been in every caBundle for the propagation time, which
  covers the API server picking the configuration up;
* a CA leaves the bundle (`RetireCas`) only when the serving certificate it
  did not sign has been in the Secret for the propagation time, which covers
  the kubelet projecting the Secret into the webhook pods and their reload.

Each step is one write; the Secret's record (`observe.Record`) says when the
last ones happened, so an interrupted run is continued by the next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Union

from webhook.certs.observe import Ca, Observed, Serving

RENEW_AFTER = 2 / 3  # of a certificate's life


@dataclass(frozen=True)
class Policy:
    """What the plan needs to know besides the facts.

    Attributes:
        dns_names: the SANs the serving certificate must carry.
        propagation: how long a change takes to reach the API server and the
            webhook pods (kubelet sync period plus the webhook's reload).
        rotate: False for `ensure` (repair only), True for `rotate` (also
            renew and rotate when due).
        renew_ca: rotate the CA now, due or not.
        renew_serving: renew the serving certificate now, due or not.
    """

    dns_names: tuple[str, ...]
    propagation: timedelta
    rotate: bool = True
    renew_ca: bool = False
    renew_serving: bool = False


@dataclass(frozen=True)
class Bootstrap:
    """No Secret: create a CA and a serving certificate; the CA goes into caBundle first.

    ``settle`` is how long to wait between the two writes: the propagation
    time where caBundle already trusts some CA (webhook pods may still be
    serving from a Secret that was deleted), else nothing (no pod can run yet).
    """

    settle: timedelta = timedelta(0)


@dataclass(frozen=True)
class IntroduceCa:
    """Add a new CA to the Secret's bundle and make it the signing CA."""

    reason: str


@dataclass(frozen=True)
class TrustBundle:
    """Write the Secret's bundle into every caBundle (if needed) and record when each CA joined."""

    patch_webhook: bool
    trusted_since: Mapping[str, datetime]


@dataclass(frozen=True)
class IssueServing:
    """Write a new serving certificate signed by the signing CA."""

    reason: str


@dataclass(frozen=True)
class RecordServing:
    """Record that the current serving certificate is in the Secret as of now."""


@dataclass(frozen=True)
class RetireCas:
    """Remove CAs that sign nothing served any more from the Secret's bundle."""

    fingerprints: tuple[str, ...]


@dataclass(frozen=True)
class Wait:
    """Nothing may be done before ``until``."""

    until: datetime
    reason: str


@dataclass(frozen=True)
class Done:
    """All is in order; ``next_due`` is when `rotate` next has work (None: never planned)."""

    next_due: datetime | None
    reason: str


Action = Union[Bootstrap, IntroduceCa, TrustBundle, IssueServing, RecordServing, RetireCas,
               Wait, Done]


def decide(seen: Observed, now: datetime, policy: Policy) -> Action:
    """Return the next step for the state ``seen`` at time ``now``."""
    if not seen.secret_exists:
        return Bootstrap(policy.propagation if seen.webhook_trusts else timedelta(0))
    signing = seen.signing_ca
    if signing is None or signing.not_after <= now:
        return IntroduceCa(seen.ca_problem or "the signing CA has expired")
    trust = _trust_step(seen, now)
    if trust:
        return trust
    broken = _unservable(seen, now, policy)
    if broken:
        return IssueServing(broken)
    serving = seen.serving
    assert serving is not None  # _unservable covers a missing one
    since = seen.serving_since
    if since is None:
        return RecordServing()
    signer_since = seen.trusted_since(signing.fingerprint)
    assert signer_since is not None  # _trust_step gave every bundle CA a time
    signer_ready = signer_since + policy.propagation
    if serving.issuer != signing.fingerprint:
        if now >= signer_ready:
            return IssueServing("switching to the new CA")
        return Wait(signer_ready, "the new CA is reaching the API server")
    old = tuple(ca.fingerprint for ca in seen.bundle if ca.fingerprint != signing.fingerprint)
    if old:
        served = since + policy.propagation
        if now >= served:
            return RetireCas(old)
        return Wait(served, "the webhook pods are loading the serving certificate")
    if not policy.rotate:
        return Done(None, "the certificates are in place")
    ca_due, serving_due = renewal_time(signing), renewal_time(serving)
    if policy.renew_ca or now >= ca_due:
        return IntroduceCa("renewal requested" if policy.renew_ca
                           else "the CA is past two thirds of its life")
    if policy.renew_serving or now >= serving_due:
        if now >= signer_ready:
            return IssueServing("renewal requested" if policy.renew_serving
                                else "the serving certificate is past two thirds of its life")
        return Wait(signer_ready, "the CA is reaching the API server")
    return Done(min(ca_due, serving_due), "nothing is due")


def renewal_time(certificate: Ca | Serving) -> datetime:
    """When two thirds of the certificate's life have passed."""
    life = certificate.not_after - certificate.not_before
    return certificate.not_before + life * RENEW_AFTER


def _trust_step(seen: Observed, now: datetime) -> TrustBundle | None:
    """The step that makes caBundle equal the Secret's bundle and records it, if one is due."""
    recorded = {ca.fingerprint: seen.trusted_since(ca.fingerprint) for ca in seen.bundle}
    if seen.webhook_in_sync and all(recorded.values()):
        return None
    # A CA the API server already had keeps its time; one it gets now starts now.
    since = {fp: (t if t and fp in seen.webhook_trusts else now) for fp, t in recorded.items()}
    return TrustBundle(patch_webhook=not seen.webhook_in_sync, trusted_since=since)


def _unservable(seen: Observed, now: datetime, policy: Policy) -> str | None:
    """Why the serving pair cannot be served at all (replaced at once), or None."""
    serving = seen.serving
    if serving is None or seen.serving_problem:
        return seen.serving_problem or "the serving certificate is missing"
    if serving.not_after <= now:
        return "the serving certificate has expired"
    missing = set(policy.dns_names) - serving.dns_names
    if missing:
        return f"the serving certificate lacks the names {sorted(missing)}"
    return None

