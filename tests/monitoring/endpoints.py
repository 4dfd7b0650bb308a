"""The real /metrics of each component, as Prometheus would scrape it: the webhook over TLS, the
extender on its metrics port, the node agent over a ledger and the NVML double; each after a
little work, so that its series carry values."""

from __future__ import annotations

import http.client
import logging
import ssl
from pathlib import Path

from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import Nvml
from runtime_hook.node.observe import Observer
from runtime_hook.node_state import StateDir
from tests.extender.cluster import (
    GIB,
    RunningExtender,
    binding_args,
    extender_args,
    node_object,
    pod_object,
)
from tests.fake_cluster_api import running
from tests.node.accounts import write_account
from tests.node.fake_pynvml import FakeDevice, FakeNvml
from tests.node.workloads_on_host import Endpoint, commit_container, start_pid_namespace
from tests.webhook.builders import container, pod, review, shared
from tests.webhook.conftest import SecretVolume, serving_pair, start_server
from webhook.pki import make_ca

GPU = "GPU-11111111-2222-3333-4444-555555555555"


def webhook(tmp_path: Path) -> str:
    """The webhook's exposition after a patched, an allowed and an invalid review."""
    ca = make_ca("vcuda test CA")
    secret = SecretVolume(tmp_path / "secret")
    secret.write_pair(serving_pair(ca))
    client = ssl.create_default_context(cadata=ca.certificate_pem.decode())
    server = start_server(secret, client, tmp_path / "webhook.log")
    try:
        server.review(review(pod(shared("train"))))
        server.review(review(pod(container("web"))))
        server.post(b"not json")
        status, body = server.request("GET", "/metrics")
    finally:
        server.stop()
    assert status == 200
    return body.decode()


def extender(tmp_path: Path) -> str:
    """The extender's exposition, from its metrics port, after a filter and two binds (one
    refused)."""
    with running(tmp_path) as api:
        api.put("/api/v1/nodes/n", node_object("n", [16 * GIB]))
        serving = RunningExtender(api, tmp_path / "extender.log")
        try:
            port = serving.start_metrics()
            big, small = pod_object("big", 60, 10), pod_object("small", 60, 10)
            for made in (big, small):
                api.add_pod(made)
                serving.sync(api)
                serving.verb("/filter", extender_args(made, ["n"]))
            serving.verb("/bind", binding_args(big, "n"))
            serving.verb("/bind", binding_args(small, "n"))  # no room left: refused
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                connection.request("GET", "/metrics")
                answer = connection.getresponse()
                assert answer.status == 200
                return answer.read().decode()
            finally:
                connection.close()
        finally:
            serving.stop()


def node(tmp_path: Path) -> str:
    """The node agent's exposition: one limited container (a real pid namespace, as the hook
    records it) with a process in its account on a GPU, and one refused start (needs root)."""
    state = tmp_path / "state"
    namespace = start_pid_namespace(children=1)
    try:
        account = commit_container(state, "c0ffee", namespace.init, 4 * GIB, 30, (GPU,))
        write_account(account, [GPU], [(namespace.ns_pids[1], namespace.start_time(1), [GIB])])
        StateDir(str(state)).count_refusal()
        device = FakeDevice(GPU, 16 * GIB, 5 * GIB, 40, busy={namespace.host_pids[1]: 25},
                            held={namespace.host_pids[1]: GIB})
        observer = Observer(Nvml(FakeNvml([device])), Problems(logging.getLogger("vcuda-node"),
                                                               "metrics"), "/", str(state))
        endpoint = Endpoint(observer, "gpu-node-1")
        try:
            port = endpoint.server.server_port
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("GET", "/metrics")
                return connection.getresponse().read().decode()
            finally:
                connection.close()
        finally:
            endpoint.stop()
    finally:
        namespace.stop()

