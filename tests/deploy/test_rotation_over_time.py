"""`vcuda-certs` over simulated years: real certificates, an injected clock, interruptions.

The cluster is `world.World`, in memory, so that years of hourly runs and a
kill before every single write stay fast; the API calls themselves are tested
against an HTTPS server in test_certs_cli.py.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
import structlog
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.deploy.world import (
    SERVICE_NAMES,
    FakeClock,
    Interrupted,
    World,
    assert_always_trusted,
    verifies,
)
from webhook.certs.act import Issuing
from webhook.certs.cluster import ClusterError, DryRun
from webhook.certs.plan import Done, Policy, Wait
from webhook.certs.runner import Outcome, run

START = datetime(2030, 1, 1, tzinfo=timezone.utc)
P = timedelta(minutes=3)
DAY = timedelta(days=1)
ISSUING = Issuing("vcuda-system", "vcuda-webhook-tls", SERVICE_NAMES, ca_validity=1095 * DAY,
                  serving_validity=90 * DAY)
ROTATE = Policy(SERVICE_NAMES, P)
ENSURE = replace(ROTATE, rotate=False)
LOG = structlog.get_logger("test")


def _run(world: World, policy: Policy = ROTATE, max_wait: float = 900.0) -> Outcome:
    return run(world, world.clock, policy, ISSUING, LOG, max_wait=max_wait)


def _world() -> World:
    world = World(FakeClock(START))
    _run(world, ENSURE)
    return world


def _certs(world: World) -> tuple[list[x509.Certificate], x509.Certificate]:
    assert world.secret is not None
    data = {k: base64.b64decode(v) for k, v in world.secret["data"].items()}
    return x509.load_pem_x509_certificates(data["ca.crt"]), \
        x509.load_pem_x509_certificate(data["tls.crt"])


# --- what ensure creates ------------------------------------------------------------------------

def test_ensure_creates_a_secret_and_writes_its_ca_into_cabundle_first() -> None:
    world = World(FakeClock(START))
    outcome = _run(world, ENSURE)
    assert outcome.steps == ("bootstrap",)
    assert isinstance(outcome.last, Done)
    assert world.secret is not None and world.secret["type"] == "kubernetes.io/tls"
    assert sorted(world.secret["data"]) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert world.bundle() == base64.b64decode(world.secret["data"]["ca.crt"])
    assert verifies(world.tls_cert(), world.bundle(), START)


def test_serving_certificate_names_both_service_names_and_serves_only_tls() -> None:
    _, serving = _certs(_world())
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(SERVICE_NAMES)
    usage = serving.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign
    eku = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert serving.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert isinstance(serving.public_key(), ec.EllipticCurvePublicKey)
    assert serving.public_key().curve.name == "secp256r1"


def test_ca_may_sign_certificates_only_and_has_no_intermediates_below_it() -> None:
    [ca], _ = _certs(_world())
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and not usage.digital_signature
    assert ca.public_key().curve.name == "secp256r1"


def test_certificates_live_as_configured_from_the_injected_clock() -> None:
    [ca], serving = _certs(_world())
    assert serving.not_valid_after_utc - serving.not_valid_before_utc == 90 * DAY
    assert ca.not_valid_after_utc - ca.not_valid_before_utc == 1095 * DAY
    assert serving.not_valid_before_utc <= START < serving.not_valid_after_utc


def test_the_chain_verifies_for_the_service_and_not_for_another_name() -> None:
    world = _world()
    assert verifies(world.tls_cert(), world.bundle(), START + DAY)
    assert not verifies(world.tls_cert(), world.bundle(), START + 91 * DAY)  # expired
    other_ca = World(FakeClock(START))
    _run(other_ca, ENSURE)
    assert not verifies(world.tls_cert(), other_ca.bundle(), START)


def test_ensure_again_changes_nothing() -> None:
    world = _world()
    before = world.read_secret()
    outcome = _run(world, ENSURE)
    assert outcome.steps == () and world.read_secret() == before


def test_a_deleted_secret_is_recreated_keeping_the_old_ca_trusted_until_retired() -> None:
    world = _world()
    old_bundle = world.bundle()
    world.secret = None
    world.clock.advance(DAY)
    assert _run(world, ENSURE, max_wait=0).steps == ("bootstrap",)
    assert old_bundle in world.bundle()  # pods may still serve the old pair
    assert world.serving_history[-1].at == world.bundle_history[-1].at + P
    outcome = _run(world, ROTATE)
    assert outcome.steps == ("retire_cas", "trust_bundle")
    assert old_bundle not in world.bundle()
    assert_always_trusted(world, P)


# --- rotation over time -------------------------------------------------------------------------

def test_serving_certificate_is_renewed_at_two_thirds_of_its_life_not_before() -> None:
    world = _world()
    world.clock.advance(60 * DAY - timedelta(hours=1))
    assert _run(world).steps == ()
    world.clock.advance(timedelta(hours=1))
    assert _run(world).steps == ("issue_serving",)
    _, serving = _certs(world)
    assert serving.not_valid_before_utc <= world.clock.now() < serving.not_valid_after_utc


def test_ensure_leaves_a_due_renewal_to_rotate() -> None:
    world = _world()
    world.clock.advance(70 * DAY)
    assert _run(world, ENSURE).steps == ()
    assert _run(world).steps == ("issue_serving",)


def test_ca_rotation_overlaps_old_and_new_ca_in_the_right_order() -> None:
    world = _world()
    [old_ca], _ = _certs(world)
    with structlog.testing.capture_logs() as logs:
        outcome = _run(world, replace(ROTATE, renew_ca=True))
    assert outcome.steps == ("introduce_ca", "trust_bundle", "issue_serving", "retire_cas",
                             "trust_bundle")
    [new_ca], serving = _certs(world)
    assert new_ca != old_ca
    serving.verify_directly_issued_by(new_ca)
    waits = [e for e in logs if e["event"] == "waiting"]
    assert [w["reason"] for w in waits] == ["the new CA is reaching the API server",
                                            "the webhook pods are loading the serving certificate"]
    assert world.clock.now() - START == 2 * P
    assert_always_trusted(world, P)


def test_without_max_wait_each_hourly_run_takes_the_steps_that_are_due() -> None:
    world = _world()
    policy = replace(ROTATE, renew_ca=True)
    assert _run(world, policy, max_wait=0).steps == ("introduce_ca", "trust_bundle")
    assert isinstance(_run(world, max_wait=0).last, Wait)  # too early: nothing written
    world.clock.advance(timedelta(hours=1))
    assert _run(world, max_wait=0).steps == ("issue_serving",)
    world.clock.advance(timedelta(hours=1))
    assert _run(world, max_wait=0).steps == ("retire_cas", "trust_bundle")
    assert_always_trusted(world, P)


def test_three_years_of_daily_runs_keep_the_webhook_trusted_and_rotate_the_ca() -> None:
    world = _world()
    steps: list[str] = []
    for _ in range(3 * 365):
        world.clock.advance(DAY)
        steps += _run(world).steps
        _, serving = _certs(world)
        assert serving.not_valid_after_utc > world.clock.now() + 20 * DAY
    assert steps.count("introduce_ca") == 1  # at day 730 of the 1095-day CA
    assert 16 <= steps.count("issue_serving") <= 19  # every 60 days, and once for the new CA
    assert_always_trusted(world, P)


# --- interruptions ------------------------------------------------------------------------------

def _rotation_writes() -> int:
    world = _world()
    written = world.writes
    _run(world, replace(ROTATE, renew_ca=True))
    return world.writes - written


@pytest.mark.parametrize("resume_after", [timedelta(0), P / 2, timedelta(hours=1)],
                         ids=["at-once", "half-propagation", "an-hour"])
def test_a_ca_rotation_killed_before_any_write_completes_safely_when_run_again(
        resume_after: timedelta) -> None:
    total = _rotation_writes()
    assert total == 7  # 5 steps, two of which also stamp the Secret after the caBundle patch
    for kill_before in range(total):
        world = _world()
        [old_ca], _ = _certs(world)
        world.stop_before_write = world.writes + kill_before
        with pytest.raises(Interrupted):
            _run(world, replace(ROTATE, renew_ca=True))
        world.stop_before_write = None
        world.clock.advance(resume_after)
        if kill_before == 0:  # nothing happened: the request has to be made again
            _run(world, replace(ROTATE, renew_ca=True))
        outcome = _run(world)
        assert isinstance(outcome.last, Done), f"killed before write {kill_before + 1}"
        [ca], serving = _certs(world)
        assert ca != old_ca and serving.verify_directly_issued_by(ca) is None
        assert world.bundle() == base64.b64decode(world.secret["data"]["ca.crt"])
        assert_always_trusted(world, P)


@pytest.mark.parametrize("kill_before", [0, 1])
def test_a_bootstrap_killed_midway_is_completed_by_the_next_run(kill_before: int) -> None:
    world = World(FakeClock(START))
    world.stop_before_write = kill_before
    with pytest.raises(Interrupted):
        _run(world, ENSURE)
    world.stop_before_write = None
    _run(world, ENSURE)
    assert verifies(world.tls_cert(), world.bundle(), START)
    _run(world, ROTATE)  # an orphan CA from the killed run is retired
    assert len(x509.load_pem_x509_certificates(world.bundle())) == 1
    assert_always_trusted(world, P)


# --- conflicts and dry runs ---------------------------------------------------------------------

def test_a_conflicting_write_is_retried_on_fresh_state() -> None:
    world = _world()
    world.foreign_writes_before_next = 2
    with structlog.testing.capture_logs() as logs:
        outcome = _run(world, replace(ROTATE, renew_serving=True))
    assert outcome.steps == ("issue_serving",)
    assert [e["attempt"] for e in logs if e["event"] == "conflict_retrying"] == [1, 2]


def test_endless_conflicts_end_in_a_clear_error() -> None:
    world = _world()
    world.foreign_writes_before_next = 100
    with pytest.raises(ClusterError, match="still conflicting after 5 tries"):
        _run(world, replace(ROTATE, renew_serving=True))


def test_dry_run_plans_the_steps_and_writes_nothing() -> None:
    world = _world()
    before, writes = world.read_secret(), world.writes
    outcome = run(DryRun(world), world.clock, replace(ROTATE, renew_ca=True), ISSUING, LOG,
                  max_wait=0)
    assert outcome.steps == ("introduce_ca", "trust_bundle")
    assert isinstance(outcome.last, Wait)
    assert world.read_secret() == before and world.writes == writes
