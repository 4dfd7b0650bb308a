"""The extender as a cluster runs it: its own process (``python -m extender.server``), serving
kube-scheduler over HTTPS on libuv's event loop, against the API server of a kubeconfig."""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.extender.cluster import (
    GIB,
    ROOT,
    ExtenderProcess,
    extender_args,
    free_port,
    node_object,
    pod_object,
)
from tests.fake_cluster_api import FakeClusterApi
from tests.webhook.conftest import SecretVolume, serving_pair
from webhook.pki import make_ca


def _one_node_and_pod(api: FakeClusterApi, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A kubeconfig for ``api``, which holds a fresh vcuda node n1 and a pod that fits it."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(api.kubeconfig())
    api.put("/api/v1/nodes/n1", node_object("n1", [16 * GIB], heartbeat=time.time()))
    pod = pod_object("p", cores=20, memory_gib=2)
    api.add_pod(pod)
    return kubeconfig, pod


def test_the_process_serves_filter_over_https_on_libuvs_event_loop(
        api: FakeClusterApi, tmp_path: Path) -> None:
    ca = make_ca("vcuda test CA")
    secret = SecretVolume(tmp_path / "secret")
    secret.write_pair(serving_pair(ca))
    kubeconfig, pod = _one_node_and_pod(api, tmp_path)
    port = free_port()
    log_file = tmp_path / "extender.log"
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "extender.server", "--host", "127.0.0.1", "--port", str(port),
             "--kubeconfig", str(kubeconfig), "--cert-file", str(secret.cert_file),
             "--key-file", str(secret.key_file)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    context = ssl.create_default_context(cadata=ca.certificate_pem.decode())

    def call(method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        try:
            connection.request(method, path, body, {"Content-Type": "application/json"})
            answer = connection.getresponse()
            return answer.status, answer.read()
        finally:
            connection.close()

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if call("GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log_file.read_text()
            time.sleep(0.05)
        status, body = call("POST", "/filter", extender_args(pod, ["n1"]))
        assert status == 200
        assert json.loads(body)["NodeNames"] == ["n1"]
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    (serving,) = [entry for entry in map(json.loads, log_file.read_text().splitlines())
                  if entry["event"] == "serving"]
    assert (serving["https"], serving["loop"]) == (True, "uvloop")


def test_the_metrics_port_serves_metrics_alone_beside_the_verbs_on_loopback(
        api: FakeClusterApi, tmp_path: Path) -> None:
    kubeconfig, pod = _one_node_and_pod(api, tmp_path)
    metrics_port = free_port()
    log_file = tmp_path / "extender.log"
    extender = ExtenderProcess(kubeconfig, log_file, flags=(
        "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port)))

    def call(method: str, path: str) -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
        try:
            connection.request(method, path, b"{}" if method == "POST" else None)
            answer = connection.getresponse()
            return answer.status, answer.read().decode()
        finally:
            connection.close()

    try:
        extender.verb("/filter", extender_args(pod, ["n1"]))
        status, text = call("GET", "/metrics")
        assert status == 200
        assert 'vcuda_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
        assert call("GET", "/healthz") == (200, "ok\n")
        for method, path in (("POST", "/bind"), ("POST", "/filter"), ("GET", "/readyz")):
            status, text = call(method, path)
            assert status == 404
            assert "this port answers GET /metrics and /healthz only" in text
    finally:
        extender.stop()
    (serving,) = [entry for entry in map(json.loads, log_file.read_text().splitlines())
                  if entry["event"] == "serving"]
    assert (serving["port"], serving["metrics_port"]) == (extender.port, metrics_port)
