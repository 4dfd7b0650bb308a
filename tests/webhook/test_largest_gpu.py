"""The bound on vcuda-memory from the largest GPU share that node agents publish on their Nodes:
the pure choice, then the webhook over real TLS reading a fake API server (real TLS, the
manifests' RBAC) as its service account would."""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime_hook.contract import ENABLED_LABEL, MAX_GPU_MEMORY_ANNOTATION
from tests.deploy.manifests import ROOT as MANIFESTS
from tests.deploy.manifests import documents
from tests.fake_kube_api import rules_from_manifests
from tests.node.fake_nodes_api import FakeNodesApi
from tests.webhook.builders import pod, review, shared
from tests.webhook.conftest import RunningServer, SecretVolume, start_server
from webhook.config import Config
from webhook.kube import Credentials, KubeError
from webhook.largest_gpu import Largest, largest_published

GIB = 1 << 30
WEBHOOK = "system:serviceaccount:vcuda-system:vcuda-webhook"
ENABLED = {ENABLED_LABEL: "true"}
UNITS_PER_GIB = 4  # vcuda-memory counts 256 MiB


def _node(name: str, published: str | None = None) -> dict[str, Any]:
    annotations = {} if published is None else {MAX_GPU_MEMORY_ANNOTATION: published}
    return {"metadata": {"name": name, "annotations": annotations}}


# --- the choice (pure) -------------------------------------------------------------------------

def test_the_largest_share_published_wins_and_nodes_without_one_do_not_count() -> None:
    nodes = [_node("a", str(80 * GIB)), _node("b"), _node("c", str(141 * GIB)),
             {"metadata": {"name": "d"}}]
    assert largest_published(nodes) == (Largest(141 * GIB, "c"), [])
    assert largest_published([_node("b")]) == (None, [])


# "²" is a digit to str.isdigit() that int() refuses: it must not end the polling task.
@pytest.mark.parametrize("value", ["lots", "-5", "1.5e9", "", str(255 << 20), "²", "9" * 5000,
                                   "9" * 401, str((1 << 50) + 1), " 17179869184", "1_7179869184"])
def test_a_value_that_is_not_bytes_of_at_least_256_mib_is_named_and_left_out(value: str) -> None:
    assert largest_published([_node("bad", value), _node("good", str(16 * GIB))]) == (
        Largest(16 * GIB, "good"), ["bad"])


# --- the webhook against the API ---------------------------------------------------------------

@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeNodesApi]:
    server = FakeNodesApi(keep_alive=True, subject=WEBHOOK)
    server.rules = rules_from_manifests(
        documents(MANIFESTS / "base" / "webhook-rbac.yaml"), WEBHOOK)
    server.add_node("h100", {}, ENABLED, {MAX_GPU_MEMORY_ANNOTATION: str(80 * GIB)})
    server.add_node("h200", {}, ENABLED, {MAX_GPU_MEMORY_ANNOTATION: str(141 * GIB)})
    # Not labelled: not a vcuda node, whatever it says.
    server.add_node("other", {}, {}, {MAX_GPU_MEMORY_ANNOTATION: str(200 * GIB)})
    server.add_node("cpu", {}, {})
    server.start(tmp_path)
    yield server
    server.stop()


def _credentials(api: FakeNodesApi) -> Credentials:
    context = ssl.create_default_context(cadata=api.ca.certificate_pem.decode())
    return Credentials(api.url, context, api.token)


@pytest.fixture
def webhook(api: FakeNodesApi, secret: SecretVolume, client_context: ssl.SSLContext,
            tmp_path: Path) -> Iterator[RunningServer]:
    running = start_server(secret, client_context, tmp_path / "webhook.log",
                           api=_credentials(api), nodes_interval=0.05)
    yield running
    running.stop()


def _asks(running: RunningServer, gib: int) -> dict[str, Any]:
    """The answer to a pod asking for a share of ``gib`` GiB."""
    return running.review(review(pod(shared("train", memory=str(gib * UNITS_PER_GIB)))))


def _bound(running: RunningServer) -> float:
    status, body = running.request("GET", "/metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "vcuda_webhook_max_gpu_memory_bytes":
            return family.samples[0].value
    raise AssertionError("no vcuda_webhook_max_gpu_memory_bytes")


def test_shares_up_to_the_largest_gpu_published_are_admitted_from_the_first_review(
    webhook: RunningServer, api: FakeNodesApi
) -> None:
    assert _asks(webhook, 100)["allowed"] is True  # more than the 80Gi default
    denied = _asks(webhook, 145)
    assert denied["allowed"] is False
    assert "than the largest GPU (141 GiB); write at most 564" in denied["status"]["message"]
    assert _bound(webhook) == 141 * GIB
    listed = api.requests[0]  # the first call, made before the webhook listens
    assert (listed.path, listed.status) == ("/api/v1/nodes", 200)
    assert parse_qs(listed.query) == {"labelSelector": [f"{ENABLED_LABEL}=true"],
                                      "resourceVersion": ["0"]}  # from the API server's cache
    assert "as=PartialObjectMetadataList" in listed.accept  # metadata alone


def _until(condition: Any, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_bound_follows_nodes_that_come_and_go(webhook: RunningServer,
                                                  api: FakeNodesApi) -> None:
    api.add_node("b200", {}, ENABLED, {MAX_GPU_MEMORY_ANNOTATION: str(180 * GIB)})
    _until(lambda: _asks(webhook, 170)["allowed"])
    for name in ("b200", "h200", "h100"):
        with api.lock:
            del api.objects[f"/api/v1/nodes/{name}"]
    _until(lambda: _bound(webhook) == 80 * GIB)  # no vcuda node publishes: the configured bound
    entries = webhook.logs(lambda lines: sum(e["event"] == "max_gpu_memory_learned"
                                             for e in lines) >= 3)
    learned = [(e["bytes"], e["node"]) for e in entries if e["event"] == "max_gpu_memory_learned"]
    assert learned[:2] == [(141 * GIB, "h200"), (180 * GIB, "b200")]
    assert learned[-1] == (None, None)


def test_max_gpu_memory_in_the_configuration_wins_and_no_node_is_read(
    api: FakeNodesApi, secret: SecretVolume, client_context: ssl.SSLContext, tmp_path: Path
) -> None:
    config = Config(max_gpu_memory=16 * GIB, max_gpu_memory_from_nodes=False)
    running = start_server(secret, client_context, tmp_path / "log", config,
                           api=_credentials(api), nodes_interval=0.05)
    try:
        denied = _asks(running, 20)
        time.sleep(0.2)
    finally:
        running.stop()
    assert "than the largest GPU (16 GiB)" in denied["status"]["message"]
    assert api.requests == []


def test_a_webhook_that_may_not_list_nodes_keeps_the_configured_bound_and_says_why(
    api: FakeNodesApi, secret: SecretVolume, client_context: ssl.SSLContext, tmp_path: Path
) -> None:
    api.rules = []  # the ClusterRole was not applied
    running = start_server(secret, client_context, tmp_path / "log", api=_credentials(api),
                           nodes_interval=0.05)
    try:
        assert "than the largest GPU (80 GiB)" in _asks(running, 100)["status"]["message"]
        time.sleep(0.3)  # several failed lists: one line
        entries = running.logs()
    finally:
        running.stop()
    [warning] = [e for e in entries if e["event"] == "max_gpu_memory_unread"]
    assert warning["reason"] == (
        f'cannot list nodes: nodes "" is forbidden: User "{WEBHOOK}" cannot list resource '
        '"nodes" in API group "" at the cluster scope')


def test_the_pods_service_account_is_read_without_a_kubeconfig(
    api: FakeNodesApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(api.ca.certificate_pem)
    (account / "token").write_text(api.token + "\n")
    host, port = api.url.removeprefix("https://").split(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    credentials = Credentials.in_cluster(str(account))
    assert credentials.url == api.url
    assert credentials.header() == {"Authorization": f"Bearer {api.token}"}
    os.remove(account / "token")
    with pytest.raises(KubeError, match=r"no Kubernetes credentials: .*/token: No such file or "
                                        r"directory \(is the service account token mounted\?\)"):
        Credentials.in_cluster(str(account))


# A value past Python's digits for int() made the first list raise: the webhook exited 1. One of
# 401 digits was taken as the bound: /metrics answered 500 and any request was admitted.
@pytest.mark.parametrize("digits", [5000, 401])
def test_a_node_publishing_a_huge_value_is_named_and_ignored_from_start_to_every_poll(
    api: FakeNodesApi, secret: SecretVolume, client_context: ssl.SSLContext, tmp_path: Path,
    digits: int
) -> None:
    api.add_node("hostile", {}, ENABLED, {MAX_GPU_MEMORY_ANNOTATION: "9" * digits})
    running = start_server(secret, client_context, tmp_path / "webhook.log",
                           api=_credentials(api), nodes_interval=0.05)
    try:
        assert _bound(running) == 141 * GIB
        huge = running.review(review(pod(shared("train", memory=str(10 ** 30)))))
        assert huge["allowed"] is False
        api.add_node("b200", {}, ENABLED, {MAX_GPU_MEMORY_ANNOTATION: str(180 * GIB)})
        _until(lambda: _bound(running) == 180 * GIB)  # the polling goes on
        entries = running.logs()
    finally:
        running.stop()
    [warning] = [e for e in entries if e["event"] == "max_gpu_memory_unread"]
    assert warning["reason"] == ("vcuda.io/max-gpu-memory is not a number of bytes from 256 MiB "
                                 "to 1 PiB in decimal digits on hostile")
