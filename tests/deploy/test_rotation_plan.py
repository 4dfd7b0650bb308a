"""The rotation state machine, one decision at a time, on hand-made facts and times."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from webhook.certs.observe import Ca, Observed, Record, Serving
from webhook.certs.plan import (
    Bootstrap,
    Done,
    IntroduceCa,
    IssueServing,
    Policy,
    RecordServing,
    RetireCas,
    TrustBundle,
    Wait,
    decide,
    renewal_time,
)

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)
DAY = timedelta(days=1)
P = timedelta(minutes=3)
NAMES = ("vcuda-webhook.vcuda-system.svc", "vcuda-webhook.vcuda-system.svc.cluster.local")
POLICY = Policy(NAMES, P)
OLD = Ca("old", T0, T0 + 900 * DAY, b"old")
NEW = Ca("new", T0 + 600 * DAY, T0 + 1500 * DAY, b"new")


def _serving(issuer: str = "old", start: datetime = T0, life: timedelta = 90 * DAY,
             names: tuple[str, ...] = NAMES) -> Serving:
    return Serving(f"serving-{issuer}-{start:%Y%m%d}", start, start + life, frozenset(names),
                   issuer)


def _settled(serving: Serving | None = None, bundle: tuple[Ca, ...] = (OLD,),
             signing: Ca = OLD, since: datetime = T0) -> Observed:
    """A Secret and caBundle in agreement, everything recorded at ``since``."""
    serving = serving or _serving()
    return Observed(
        secret_exists=True, bundle=bundle, signing_ca=signing, serving=serving,
        record=Record((serving.fingerprint, since), {c.fingerprint: since for c in bundle}),
        webhook_trusts=frozenset(c.fingerprint for c in bundle), webhook_in_sync=True)


def test_a_missing_secret_is_bootstrapped() -> None:
    assert isinstance(decide(Observed(secret_exists=False), T0, POLICY), Bootstrap)


def test_settled_certificates_need_nothing_until_two_thirds_of_the_serving_life() -> None:
    action = decide(_settled(), T0 + DAY, POLICY)
    assert action == Done(T0 + 60 * DAY, "nothing is due")


def test_renewal_time_is_two_thirds_of_the_life() -> None:
    assert renewal_time(_serving(life=90 * DAY)) == T0 + 60 * DAY
    assert renewal_time(OLD) == T0 + 600 * DAY


def test_serving_certificate_is_renewed_after_two_thirds_of_its_life() -> None:
    assert isinstance(decide(_settled(), T0 + 60 * DAY - timedelta(seconds=1), POLICY), Done)
    action = decide(_settled(), T0 + 60 * DAY, POLICY)
    assert action == IssueServing("the serving certificate is past two thirds of its life")


def test_ensure_never_starts_a_renewal() -> None:
    ensure = replace(POLICY, rotate=False)
    assert decide(_settled(), T0 + 80 * DAY, ensure) == Done(None, "the certificates are in place")


def test_ca_rotation_starts_after_two_thirds_of_the_ca_life() -> None:
    serving = _serving(start=T0 + 590 * DAY)
    assert isinstance(decide(_settled(serving), T0 + 599 * DAY, POLICY), Done)
    action = decide(_settled(serving), T0 + 600 * DAY, POLICY)
    assert action == IntroduceCa("the CA is past two thirds of its life")


def test_requested_renewals_happen_before_they_are_due() -> None:
    assert decide(_settled(), T0 + DAY, replace(POLICY, renew_ca=True)) == \
        IntroduceCa("renewal requested")
    assert decide(_settled(), T0 + DAY, replace(POLICY, renew_serving=True)) == \
        IssueServing("renewal requested")


# --- the CA rotation, step by step --------------------------------------------------------------

def _introduced(now: datetime) -> Observed:
    """The new CA is in the Secret and signs; caBundle does not have it yet."""
    settled = _settled(_serving(start=now - 10 * DAY), since=now - 10 * DAY)
    return replace(settled, bundle=(NEW, OLD), signing_ca=NEW, webhook_in_sync=False)


def test_a_new_ca_goes_into_cabundle_first_and_is_recorded_as_trusted_from_now() -> None:
    now = T0 + 600 * DAY
    action = decide(_introduced(now), now, POLICY)
    assert action == TrustBundle(patch_webhook=True,
                                 trusted_since={"new": now, "old": now - 10 * DAY})


def _trusted(now: datetime, new_since: datetime) -> Observed:
    seen = _introduced(now)
    record = replace(seen.record, trusted_since={"old": now - 10 * DAY, "new": new_since})
    return replace(seen, record=record, webhook_trusts=frozenset({"old", "new"}),
                   webhook_in_sync=True)


def test_serving_certificate_switches_to_the_new_ca_only_after_propagation() -> None:
    joined = T0 + 600 * DAY
    waiting = decide(_trusted(joined, joined), joined + P - timedelta(seconds=1), POLICY)
    assert waiting == Wait(joined + P, "the new CA is reaching the API server")
    assert decide(_trusted(joined, joined), joined + P, POLICY) == \
        IssueServing("switching to the new CA")


def test_ensure_also_finishes_a_rotation_in_progress() -> None:
    joined = T0 + 600 * DAY
    assert decide(_trusted(joined, joined), joined + P, replace(POLICY, rotate=False)) == \
        IssueServing("switching to the new CA")


def _switched(switched_at: datetime) -> Observed:
    seen = _trusted(switched_at, switched_at - P)
    serving = _serving("new", start=switched_at)
    return replace(seen, serving=serving,
                   record=replace(seen.record, serving_since=(serving.fingerprint, switched_at)))


def test_old_ca_leaves_only_after_the_pods_had_time_to_load_the_new_certificate() -> None:
    switched = T0 + 601 * DAY
    assert decide(_switched(switched), switched + timedelta(seconds=10), POLICY) == \
        Wait(switched + P, "the webhook pods are loading the serving certificate")
    assert decide(_switched(switched), switched + P, POLICY) == RetireCas(("old",))


def test_after_retirement_cabundle_is_rewritten_keeping_the_new_ca_time() -> None:
    switched = T0 + 601 * DAY
    seen = _switched(switched)
    retired = replace(seen, bundle=(NEW,), webhook_in_sync=False)
    assert decide(retired, switched + P, POLICY) == \
        TrustBundle(patch_webhook=True, trusted_since={"new": switched - P})


# --- repairs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("problem", ["tls.key does not belong to tls.crt",
                                     "tls.crt is signed by no CA of ca.crt",
                                     "tls.crt or tls.key is missing"])
def test_an_unservable_pair_is_replaced_at_once(problem: str) -> None:
    seen = replace(_settled(), serving_problem=problem)
    assert decide(seen, T0 + DAY, POLICY) == IssueServing(problem)


def test_an_expired_serving_certificate_is_replaced_at_once_even_by_ensure() -> None:
    action = decide(_settled(), T0 + 91 * DAY, replace(POLICY, rotate=False))
    assert action == IssueServing("the serving certificate has expired")


def test_a_serving_certificate_without_the_service_names_is_replaced() -> None:
    seen = _settled(_serving(names=("other.svc",)))
    action = decide(seen, T0 + DAY, POLICY)
    assert isinstance(action, IssueServing) and NAMES[0] in action.reason


def test_a_missing_signing_ca_starts_a_new_ca_with_the_reason() -> None:
    seen = replace(_settled(), signing_ca=None, ca_problem="ca.key belongs to no CA of ca.crt")
    assert decide(seen, T0 + DAY, POLICY) == IntroduceCa("ca.key belongs to no CA of ca.crt")


def test_an_expired_signing_ca_starts_a_new_ca() -> None:
    assert decide(_settled(), T0 + 901 * DAY, POLICY) == IntroduceCa("the signing CA has expired")


def test_cabundle_changed_by_somebody_else_is_rewritten_and_its_cas_trusted_anew() -> None:
    seen = replace(_settled(), webhook_in_sync=False, webhook_trusts=frozenset())
    assert decide(seen, T0 + DAY, POLICY) == \
        TrustBundle(patch_webhook=True, trusted_since={"old": T0 + DAY})


def test_an_unrecorded_trust_is_recorded_as_of_now_without_patching() -> None:
    seen = replace(_settled(), record=Record(_settled().record.serving_since, {}))
    assert decide(seen, T0 + DAY, POLICY) == \
        TrustBundle(patch_webhook=False, trusted_since={"old": T0 + DAY})


def test_an_unrecorded_serving_certificate_is_recorded_as_of_now() -> None:
    seen = replace(_settled(), record=replace(_settled().record, serving_since=None))
    assert decide(seen, T0 + DAY, POLICY) == RecordServing()


def test_a_record_for_another_serving_certificate_does_not_count() -> None:
    seen = replace(_settled(), record=replace(_settled().record, serving_since=("other", T0)))
    assert seen.serving_since is None
    assert decide(seen, T0 + DAY, POLICY) == RecordServing()


def test_an_unreadable_record_reads_as_no_record() -> None:
    assert Record.from_json("{not json") == Record()
    assert Record.from_json('{"servingSince": {"fingerprint": "x", "at": "2030-01-01"}}') == \
        Record()  # a time without a zone is not trusted either
