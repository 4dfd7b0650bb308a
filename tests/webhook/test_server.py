"""The webhook over real TLS: decisions, bad input, health, metrics and decision logs."""

from __future__ import annotations

import base64
import json
import re
import ssl
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from tests.webhook.builders import container, pod, review, shared
from tests.webhook.conftest import RunningServer, SecretVolume, start_server
from webhook.config import Config
from webhook.pki import make_ca


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


# --- answers ---------------------------------------------------------------------------------

def test_a_shared_pod_is_answered_with_its_uid_and_a_json_patch(server: RunningServer) -> None:
    response = server.review(review(pod(shared("train")), uid="uid-1"))
    assert response["uid"] == "uid-1"
    assert response["allowed"] is True
    assert "warnings" not in response
    result = jsonpatch.apply_patch(pod(shared("train")), patch_of(response))
    assert result["metadata"]["annotations"]["vcuda.io/limits"] == \
        '{"train":{"cores":30,"memory":10737418240}}'
    assert result["spec"]["runtimeClassName"] == "vcuda"


def test_the_webhooks_own_output_comes_back_without_a_patch(server: RunningServer) -> None:
    first = jsonpatch.apply_patch(pod(shared("train")),
                                  patch_of(server.review(review(pod(shared("train"))))))
    response = server.review(review(first))
    assert response["allowed"] is True
    assert "patch" not in response and "patchType" not in response


def test_a_denial_carries_the_message_in_status(server: RunningServer) -> None:
    response = server.review(review(pod(shared("train", cores="150"))))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "write one of those" in response["status"]["message"]
    assert "patch" not in response


def test_warnings_are_returned_in_response_warnings(server: RunningServer) -> None:
    response = server.review(review(pod(shared("train", cores="100"))))
    assert response["allowed"] is True
    assert response["warnings"] == ['container "train": docker.com/vcuda-memory is ignored with '
                                    "whole GPUs (docker.com/vcuda-core: 100)"]


def test_dry_run_is_answered_exactly_as_a_real_request(server: RunningServer) -> None:
    for obj in (pod(shared("train")), pod(shared("train", memory="0"))):
        real = server.review(review(obj, uid="same"))
        dry = server.review(review(obj, uid="same", dry_run=True))
        assert dry == real


def test_an_update_that_changes_the_annotation_is_denied(server: RunningServer) -> None:
    stored = pod(shared("train"), annotations={"vcuda.io/limits": '{"train":{"cores":30}}'})
    changed = pod(shared("train"), annotations={"vcuda.io/limits": '{"train":{"cores":99}}'})
    response = server.review(review(changed, operation="UPDATE", old=stored))
    assert response["allowed"] is False
    assert "cannot be changed afterwards" in response["status"]["message"]


def test_the_server_uses_its_config(secret: SecretVolume, client_context: ssl.SSLContext,
                                    tmp_path: Path) -> None:
    running = start_server(secret, client_context, tmp_path / "log",
                           Config(max_gpu_memory=16 << 30))
    try:
        response = running.review(review(pod(shared("train", memory="65"))))
    finally:
        running.stop()
    assert "the largest GPU (16 GiB); write at most 64" in response["status"]["message"]


# --- bad input: a clear 400 when there is no review to answer --------------------------------

def valid() -> dict[str, Any]:
    return review(pod(shared("train")))


def without(path: str) -> dict[str, Any]:
    body = valid()
    *parents, last = path.split(".")
    target = body
    for key in parents:
        target = target[key]
    del target[last]
    return body


def changed(path: str, value: Any) -> dict[str, Any]:
    body = valid()
    *parents, last = path.split(".")
    target = body
    for key in parents:
        target = target[key]
    target[last] = value
    return body


@pytest.mark.parametrize(("body", "message"), [
    (b'{"apiVersion": "admission.k8s.io/v1", ', "body is not JSON: it ends before its JSON does"),
    (b"", "body is not JSON: it ends before its JSON does"),
    (b"\xff\xfe", "body is not UTF-8: byte 0xff at offset 0"),
    (b'{"apiVersion": "admission.k8s.io/v1",}', "body is not JSON: it goes wrong at character 37"),
    (b'{"apiVersion": NaN}', "body is not JSON: it holds NaN, Infinity or a number out of range"),
    (b'{"apiVersion": 1e999}',
     "body is not JSON: it holds NaN, Infinity or a number out of range"),
    (b"[1, 2]", "body is not a JSON object"),
    (json.dumps(changed("apiVersion", "admission.k8s.io/v1beta1")).encode(),
     "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got "
     "'admission.k8s.io/v1beta1' and 'AdmissionReview'"),
    (json.dumps(changed("kind", "Pod")).encode(),
     "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got "
     "'admission.k8s.io/v1' and 'Pod'"),
    (json.dumps(without("kind")).encode(),
     "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got "
     "'admission.k8s.io/v1' and nothing"),
    (json.dumps(without("request")).encode(), "request is missing or not an object"),
    (json.dumps(changed("request", [])).encode(), "request is missing or not an object"),
    (json.dumps(without("request.uid")).encode(), "request.uid is missing or not a string"),
    (json.dumps(changed("request.uid", 42)).encode(), "request.uid is missing or not a string"),
    (json.dumps(changed("request.uid", "")).encode(), "request.uid is missing or not a string"),
], ids=["truncated", "empty", "not-utf8", "trailing-comma", "nan", "huge-number", "array",
        "v1beta1", "wrong-kind", "no-kind", "no-request", "request-array", "no-uid", "uid-number",
        "uid-empty"])
def test_a_body_without_a_review_to_answer_gets_a_clear_400(server: RunningServer, body: bytes,
                                                            message: str) -> None:
    status, answer = server.post(body)
    assert (status, answer.decode()) == (400, f"bad AdmissionReview: {message}\n")


def test_a_body_over_3_mib_gets_a_clear_400(server: RunningServer) -> None:
    huge = valid()
    huge["request"]["object"]["metadata"]["annotations"] = {"padding": "x" * (3 << 20)}
    status, answer = server.post(json.dumps(huge).encode())
    assert status == 400
    assert "body is over the 3145728-byte (3 MiB) limit of an AdmissionReview" in answer.decode()
    assert server.review(valid())["allowed"] is True  # and the server goes on serving


def test_a_body_of_exactly_3_mib_is_still_read(server: RunningServer) -> None:
    body = valid()
    body["request"]["object"]["metadata"]["annotations"] = {"padding": ""}
    size = len(json.dumps(body).encode())
    body["request"]["object"]["metadata"]["annotations"]["padding"] = "x" * ((3 << 20) - size)
    encoded = json.dumps(body).encode()
    assert len(encoded) == 3 << 20
    status, _ = server.post(encoded)
    assert status == 200


# --- bad input: allowed false with a message when the review itself is well-formed -----------

@pytest.mark.parametrize(("obj", "message"), [
    ({"metadata": {}, "spec": {"containers": {"name": "a"}}},
     "request.object.spec.containers is an object, where a list belongs"),
    ({"metadata": {}, "spec": {"containers": [{"name": 7}]}},
     "request.object.spec.containers[0].name is a number, where a string belongs"),
    ({"metadata": {}, "spec": {"containers": [{"image": "x"}]}},
     "request.object.spec.containers[0] has no name, which it must have"),
    (pod(shared("train", cores=None)),
     'request.object.spec.containers[0].resources.limits["docker.com/vcuda-core"] is null, '
     "where a string or a number belongs"),
    (pod(container("a"), annotations={"team": 7}),
     'request.object.metadata.annotations["team"] is a number, where a string belongs'),
    ({"metadata": {}}, "request.object has no spec, which it must have"),
    ("a pod", "request.object is a string, where an object or null belongs"),
    (pod(container("a", security_context={"privileged": "yes"})),
     "request.object.spec.containers[0].securityContext.privileged is a string, "
     "where a boolean or null belongs"),
], ids=["containers-object", "name-number", "no-name", "null-limit", "annotation-number",
        "no-spec", "string", "privileged-string"])
def test_a_malformed_pod_is_denied_with_where_it_is_wrong(server: RunningServer, obj: Any,
                                                          message: str) -> None:
    response = server.review(review(obj, uid="bad-pod"))
    assert response["uid"] == "bad-pod"
    assert response["allowed"] is False
    assert response["status"]["message"] == f"the pod is malformed: {message}"


def test_a_create_without_a_pod_is_denied(server: RunningServer) -> None:
    response = server.review(review(None))
    assert response["allowed"] is False
    assert "request.object is missing" in response["status"]["message"]


def test_an_object_that_is_not_a_pod_is_denied(server: RunningServer) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"replicas": 1, "template": {"spec": {"containers": []}}}}
    response = server.review(review(deployment, kind={"group": "apps", "version": "v1",
                                                      "kind": "Deployment"}))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "vcuda reviews pods only, and this is apps/v1 Deployment; the "
        "MutatingWebhookConfiguration should send it pods only")


def test_a_delete_whose_object_is_not_a_pod_body_is_allowed(server: RunningServer) -> None:
    response = server.review(review({"kind": "DeleteOptions"}, operation="DELETE"))
    assert response["allowed"] is True


# --- health, readiness, metrics, logs ------------------------------------------------------

def test_other_paths_and_methods_are_refused_with_what_is_served(server: RunningServer) -> None:
    status, body = server.request("GET", "/")
    assert (status, body) == (404, b"not found: this server answers POST /mutate, GET /healthz, "
                                   b"/readyz and /metrics\n")
    assert server.request("GET", "/mutate") == (405, b"/mutate takes POST only\n")
    assert server.request("POST", "/healthz", b"{}")[0] == 405


def test_healthz_and_readyz_answer_ok(server: RunningServer) -> None:
    assert server.request("GET", "/healthz") == (200, b"ok\n")
    assert server.request("GET", "/readyz") == (200, b"ok\n")


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"{name} not in metrics"
    return float(match.group(1))


def test_metrics_count_reviews_by_decision_and_time_them(server: RunningServer) -> None:
    server.review(review(pod(shared("train"))))
    server.review(review(pod(shared("train"))))
    server.review(review(pod(container("web"))))
    server.review(review(pod(shared("train", cores="0"))))
    server.post(b"not json")
    status, body = server.request("GET", "/metrics")
    assert status == 200
    text = body.decode()
    counts = {d: metric(text, f'vcuda_webhook_reviews_total{{decision="{d}"}}')
              for d in ("patched", "allowed", "denied", "invalid")}
    assert counts == {"patched": 2, "allowed": 1, "denied": 1, "invalid": 1}
    assert metric(text, "vcuda_webhook_review_seconds_count") == 5
    assert 0 < metric(text, "vcuda_webhook_review_seconds_sum") < 5


def test_metrics_give_the_seconds_until_the_certificate_expires(server: RunningServer) -> None:
    text = server.request("GET", "/metrics")[1].decode()
    seconds = metric(text, "vcuda_webhook_certificate_expiry_seconds")
    assert 30 * 86400 - 5 * 60 - 120 < seconds <= 30 * 86400 - 5 * 60


def test_every_decision_is_logged_as_json_with_uid_namespace_pod_and_reason(
        server: RunningServer) -> None:
    server.review(review(pod(shared("train")), uid="u-patched", namespace="team-a"))
    server.review(review(pod(shared("train", cores="0"), name="named"), uid="u-denied"))
    server.post(b"{")
    reviews = [entry for entry in server.logs(lambda lines: len(lines) >= 4)
               if entry["event"] == "review"]
    patched, denied, invalid = reviews
    assert patched["uid"] == "u-patched"
    assert patched["namespace"] == "team-a"  # from request.namespace, not the pod
    assert patched["pod"] == "trainer-*"  # a generateName
    assert patched["decision"] == "patched"
    assert patched["reason"].startswith("patched /spec/containers/0/resources/limits/")
    assert patched["level"] == "info"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", patched["time"])
    assert (denied["pod"], denied["decision"]) == ("named", "denied")
    assert "is neither a share" in denied["reason"]
    assert (invalid["decision"], invalid["level"]) == ("invalid", "warning")
    assert invalid["reason"].startswith("body is not JSON")


def test_warnings_and_dry_run_are_logged_when_present(server: RunningServer) -> None:
    server.review(review(pod(shared("train", cores="100")), uid="u-dry", dry_run=True))
    (entry,) = [e for e in server.logs(lambda lines: len(lines) >= 2) if e.get("uid") == "u-dry"]
    assert entry["dry_run"] is True
    assert entry["warnings"] == ['container "train": docker.com/vcuda-memory is ignored with '
                                 "whole GPUs (docker.com/vcuda-core: 100)"]


def test_a_client_that_does_not_trust_the_ca_is_refused(server: RunningServer) -> None:
    other = ssl.create_default_context(cadata=make_ca("other").certificate_pem.decode())
    server.client_context = other
    with pytest.raises(ssl.SSLCertVerificationError):
        server.request("GET", "/healthz")
