"""`vcuda-certs` as a command, against a local HTTPS server with the Kubernetes API's semantics."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.fake_apiserver import FakeApiServer, rules_from_manifests
from tests.deploy.manifests import ROOT as MANIFESTS
from tests.deploy.manifests import documents, find
from tests.deploy.world import FakeClock, verifies
from webhook.certs.cli import main

SECRET = "/api/v1/namespaces/vcuda-system/secrets/vcuda-webhook-tls"
SECRETS = "/api/v1/namespaces/vcuda-system/secrets"
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vcuda-webhook"
SA = "system:serviceaccount:vcuda-system:vcuda-certs"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[FakeApiServer]:
    api = FakeApiServer()
    api.start(tmp_path)
    api.put(MWC, find("MutatingWebhookConfiguration", "vcuda-webhook"))
    yield api
    api.stop()


@pytest.fixture
def kubeconfig(server: FakeApiServer, tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(server.kubeconfig())
    return path


def _certs(kubeconfig: Path, *args: str, clock: FakeClock | None = None) -> int:
    command, *rest = args
    return main([command, "--kubeconfig", str(kubeconfig), *rest],
                clock=clock or FakeClock(datetime.now(timezone.utc)))


def _logs(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line]


def _finished(logs: list[dict[str, Any]]) -> dict[str, Any]:
    [event] = [e for e in logs if e["event"] == "finished"]
    return event


def _bundle(server: FakeApiServer) -> bytes:
    mwc = server.get(MWC)
    assert mwc is not None
    [webhook] = mwc["webhooks"]
    return base64.b64decode(webhook["clientConfig"]["caBundle"])


def _secret_file(server: FakeApiServer, key: str) -> bytes:
    secret = server.get(SECRET)
    assert secret is not None
    return base64.b64decode(secret["data"][key])


def test_ensure_writes_the_ca_into_cabundle_then_creates_the_secret(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _certs(kubeconfig, "ensure") == 0
    writes = [(r.method, r.path, r.status) for r in server.requests if r.method != "GET"]
    assert writes == [("PATCH", MWC, 200), ("POST", SECRETS, 201)]
    patch = next(r for r in server.requests if r.method == "PATCH")
    assert patch.content_type.startswith("application/strategic-merge-patch+json")
    assert _bundle(server) == _secret_file(server, "ca.crt")
    assert verifies(_secret_file(server, "tls.crt"), _bundle(server), datetime.now(timezone.utc))
    logs = _logs(capsys)
    assert [e["event"] for e in logs] == ["bootstrap", "certificates_in_order", "finished"]
    assert all(e["level"] == "info" and e["command"] == "ensure" and "time" in e
               for e in logs)


def test_the_manifest_patch_keeps_every_other_field_of_the_webhook(
        server: FakeApiServer, kubeconfig: Path) -> None:
    before = server.get(MWC)
    assert _certs(kubeconfig, "ensure") == 0
    after = server.get(MWC)
    assert before is not None and after is not None
    del after["webhooks"][0]["clientConfig"]["caBundle"]
    assert after["webhooks"] == before["webhooks"]
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])


def test_ensure_on_settled_certificates_only_reads(server: FakeApiServer,
                                                   kubeconfig: Path) -> None:
    assert _certs(kubeconfig, "ensure") == 0
    server.requests.clear()
    assert _certs(kubeconfig, "ensure") == 0
    assert {r.method for r in server.requests} == {"GET"}


def test_rotate_renew_ca_goes_through_every_step_over_the_api(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _certs(kubeconfig, "ensure") == 0
    old_bundle = _bundle(server)
    capsys.readouterr()
    assert _certs(kubeconfig, "rotate", "--renew-ca", "--max-wait", "10m") == 0
    assert _finished(_logs(capsys))["steps"] == [
        "introduce_ca", "trust_bundle", "issue_serving", "retire_cas", "trust_bundle"]
    assert old_bundle not in _bundle(server)
    assert verifies(_secret_file(server, "tls.crt"), _bundle(server), datetime.now(timezone.utc))


def test_without_max_wait_rotate_stops_at_the_first_wait_and_says_when_to_go_on(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _certs(kubeconfig, "ensure") == 0
    capsys.readouterr()
    assert _certs(kubeconfig, "rotate", "--renew-ca") == 0
    finished = _finished(_logs(capsys))
    assert finished["steps"] == ["introduce_ca", "trust_bundle"]
    assert finished["next_step_at"]


def test_a_stale_secret_resource_version_gets_409_and_the_tool_reads_again(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _certs(kubeconfig, "ensure") == 0
    bumps = [SECRET]
    server.before_write = lambda path: server.bump(bumps.pop()) if path in bumps else None
    assert _certs(kubeconfig, "rotate", "--renew-serving", "--propagation", "0") == 0
    assert [r.status for r in server.requests if r.method == "PUT"] == [409, 200]
    retries = [e for e in _logs(capsys) if e["event"] == "conflict_retrying"]
    assert len(retries) == 1 and "the object has been modified" in retries[0]["error"]


def test_a_stale_webhook_config_resource_version_gets_409_and_the_tool_reads_again(
        server: FakeApiServer, kubeconfig: Path) -> None:
    bumps = [MWC]
    server.before_write = lambda path: server.bump(bumps.pop()) if path in bumps else None
    assert _certs(kubeconfig, "ensure") == 0
    assert [r.status for r in server.requests if r.method == "PATCH"] == [409, 200]
    assert _bundle(server) == _secret_file(server, "ca.crt")


def test_a_secret_created_meanwhile_by_another_run_is_adopted(
        server: FakeApiServer, kubeconfig: Path) -> None:
    assert _certs(kubeconfig, "ensure") == 0
    theirs = server.get(SECRET)
    assert theirs is not None
    server.objects.pop(SECRET)
    server.put(MWC, find("MutatingWebhookConfiguration", "vcuda-webhook"))
    server.requests.clear()
    server.before_write = lambda path: server.put(SECRET, theirs) \
        if path == SECRET and server.get(SECRET) is None else None
    assert _certs(kubeconfig, "ensure", "--propagation", "0") == 0
    assert [r.status for r in server.requests if r.method == "POST"] == [409]
    assert _bundle(server) == _secret_file(server, "ca.crt") == \
        base64.b64decode(theirs["data"]["ca.crt"])


def test_a_damaged_secret_is_repaired_with_the_reason_logged(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _certs(kubeconfig, "ensure") == 0
    secret = server.get(SECRET)
    assert secret is not None
    secret["data"]["tls.key"] = secret["data"]["ca.key"]
    server.put(SECRET, secret)
    capsys.readouterr()
    assert _certs(kubeconfig, "ensure") == 0
    [issued] = [e for e in _logs(capsys) if e["event"] == "issue_serving"]
    assert issued["reason"] == "tls.key does not belong to tls.crt"
    assert verifies(_secret_file(server, "tls.crt"), _bundle(server), datetime.now(timezone.utc))


def test_dry_run_reads_logs_the_plan_and_writes_nothing(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _certs(kubeconfig, "ensure", "--dry-run") == 0
    assert {r.method for r in server.requests} == {"GET"}
    assert server.get(SECRET) is None
    logs = _logs(capsys)
    assert _finished(logs)["steps"] == ["bootstrap"]
    assert all(e["dry_run"] is True for e in logs)


def test_dry_run_skips_the_wait_a_real_recreation_would_make(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _certs(kubeconfig, "ensure") == 0
    server.objects.pop(SECRET)  # caBundle still trusts a CA: a real run would wait 180 s
    clock = FakeClock(datetime.now(timezone.utc))
    start = clock.now()
    capsys.readouterr()
    assert _certs(kubeconfig, "ensure", "--dry-run", clock=clock) == 0
    assert clock.now() == start
    assert _finished(_logs(capsys))["steps"] == ["bootstrap"]
    assert server.get(SECRET) is None


# --- RBAC ---------------------------------------------------------------------------------------

def _manifest_rules() -> list[Any]:
    return rules_from_manifests(documents(MANIFESTS / "base" / "certs-rbac.yaml"), SA)


@pytest.mark.parametrize(("verb", "resource", "command"), [
    ("create", "secrets", "ensure"),
    ("get", "secrets", "ensure"),
    ("update", "secrets", "rotate"),
    ("get", "mutatingwebhookconfigurations", "ensure"),
    ("patch", "mutatingwebhookconfigurations", "ensure"),
])
def test_each_missing_permission_fails_with_an_error_naming_verb_and_resource(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str],
        verb: str, resource: str, command: str) -> None:
    if command == "rotate":
        assert _certs(kubeconfig, "ensure") == 0
    rules = _manifest_rules()
    for rule in rules:
        if resource in rule.resources:
            rule.verbs = [v for v in rule.verbs if v != verb]
    server.rules = rules
    capsys.readouterr()
    extra = ["--renew-serving", "--propagation", "0"] if command == "rotate" else []
    assert _certs(kubeconfig, command, *extra) == 1
    [error] = [e for e in _logs(capsys) if e["event"] == "failed"]
    assert error["level"] == "error"
    assert f"missing RBAC permission: cannot {verb} {resource}" in error["error"]
    assert f"Grant verb {verb!r} on resource {resource!r}" in error["error"]
    assert server.requests[-1].status == 403


# --- errors a user can run into -----------------------------------------------------------------

def test_a_missing_webhook_configuration_says_to_apply_the_manifests(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server.objects.pop(MWC)
    assert _certs(kubeconfig, "ensure") == 1
    [error] = [e for e in _logs(capsys) if e["event"] == "failed"]
    assert "MutatingWebhookConfiguration 'vcuda-webhook' does not exist" in error["error"]
    assert "kubectl apply -k manifests/" in error["error"]
    assert server.get(SECRET) is None


def test_a_webhook_configuration_without_webhooks_is_refused(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server.put(MWC, {**find("MutatingWebhookConfiguration", "vcuda-webhook"), "webhooks": []})
    assert _certs(kubeconfig, "ensure") == 1
    [error] = [e for e in _logs(capsys) if e["event"] == "failed"]
    assert "has no webhooks to give a caBundle" in error["error"]


def test_a_rejected_token_is_reported(server: FakeApiServer, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad"
    path.write_text(server.kubeconfig(token="wrong"))
    assert _certs(path, "ensure") == 1
    [error] = [e for e in _logs(capsys) if e["event"] == "failed"]
    assert "rejected the credentials" in error["error"]


def test_an_unreachable_api_server_is_reported_after_retries(
        server: FakeApiServer, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server.stop()
    clock = FakeClock(datetime.now(timezone.utc))
    assert _certs(kubeconfig, "ensure", clock=clock) == 1
    [error] = [e for e in _logs(capsys) if e["event"] == "failed"]
    assert "cannot reach the API server to get secrets 'vcuda-webhook-tls'" in error["error"]
    assert (clock.now() - datetime.now(timezone.utc)).total_seconds() > 6  # backed off 1+2+4 s


def test_a_missing_kubeconfig_is_reported(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _certs(tmp_path / "nowhere", "ensure") == 1
    [error] = [e for e in _logs(capsys) if e["event"] == "failed"]
    assert "no Kubernetes credentials" in error["error"]


@pytest.mark.parametrize(("args", "message"), [
    (["--propagation", "soon"], "--propagation: 'soon' is not a duration"),
    (["--max-wait", "-5"], "--max-wait: '-5' is not a duration"),
    (["--serving-validity", "0"], "must be longer than zero"),
    (["--serving-validity", "400d", "--ca-validity", "300d"],
     "must not be longer than --ca-validity"),
    (["--propagation", "11d"], "shorter than a ninth of --serving-validity"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         args: list[str], message: str) -> None:
    assert _certs(tmp_path / "unused", "rotate", *args) == 2
    assert message in capsys.readouterr().err


def test_a_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_help_explains_both_commands_and_the_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for words in ("ensure", "rotate", "thirds of its life", "new CA joins", "--propagation"):
        assert words in text
