"""Faults on the real cluster while vcuda works: a webhook pod evicted during a stream of pod
creations, the node agent's pod deleted with a limited container running, and the webhook's
serving certificate renewed while the apiserver keeps sending reviews."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from tests.cluster.kube import Api, Cluster
from tests.cluster.vcuda import GPUS_MIB, NAMESPACE
from tests.cri.images import BUSYBOX_IMAGE

NODE = "vcuda-test-node"
FAULTS = "vcuda-faults"
SHARE = {"docker.com/vcuda-core": "1", "docker.com/vcuda-memory": "1"}
WEBHOOK = "app.kubernetes.io/name=vcuda-webhook"
STREAM = 200  # pods created while a webhook pod is evicted


def _pending_pod() -> dict:
    """A vcuda pod that the webhook reviews and no node takes (its nodeSelector matches none):
    created, it costs the apiserver and etcd only."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "stream-"},
            "spec": {"nodeSelector": {"vcuda.io/faults-test": "nowhere"},
                     "automountServiceAccountToken": False, "containers": [{
                         "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                         "resources": {"limits": SHARE}}]}}


class Stream:
    """Pods created through the apiserver by ``workers`` clients at once (so that the
    apiserver's connections to the webhook go to both replicas), each pod reviewed by the
    webhook, until ``count`` were asked for or ``stop`` is called; with ``dry_run`` the
    apiserver admits them (webhook included) and stores none; each client waits ``pause``
    seconds after each pod."""

    def __init__(self, cluster: Cluster, workers: int = 4, count: int | None = None,
                 dry_run: bool = False, pause: float = 0.0) -> None:
        self._pause = pause
        self._path = f"/api/v1/namespaces/{FAULTS}/pods" + ("?dryRun=All" if dry_run else "")
        self.created: list[str] = []
        self.failed: list[str] = []
        self._left = count
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._create, args=(cluster.api(),))
                         for _ in range(workers)]
        for thread in self._threads:
            thread.start()

    def _next(self) -> bool:
        with self._lock:
            if self._stopped.is_set() or self._left == 0:
                return False
            if self._left is not None:
                self._left -= 1
            return True

    def _create(self, api: Api) -> None:
        while self._next():
            status, answer = api.request("POST", self._path, _pending_pod())
            if status == 201:
                self.created.append(answer["metadata"].get("name", ""))
            else:
                self.failed.append(f"{status}: {answer.get('message', answer)}")
            self._stopped.wait(self._pause)
        api.close()

    def wait_for(self, created: int) -> None:
        while len(self.created) + len(self.failed) < created:
            time.sleep(0.05)

    def join(self) -> None:
        """Wait for the clients (until ``count`` or ``stop``)."""
        for thread in self._threads:
            thread.join()

    def stop(self) -> None:
        """Ask no more pods (those asked are answered), and wait for the clients."""
        self._stopped.set()
        self.join()


@pytest.fixture
def faults(vcuda: Cluster) -> Iterator[Cluster]:
    """A namespace of its own for the streams' pods, deleted with them afterwards."""
    vcuda.ok("create", "namespace", FAULTS)
    try:
        deadline = time.monotonic() + 60
        while vcuda.kubectl("get", "-n", FAULTS, "serviceaccount/default").returncode != 0:
            assert time.monotonic() < deadline, f"no default ServiceAccount in {FAULTS}"
            time.sleep(0.5)
        yield vcuda
    finally:
        vcuda.ok("delete", "namespace", FAULTS, "--wait=true", timeout=300)


def _webhook_pods(cluster: Cluster) -> list[dict]:
    return [pod for pod in cluster.get("pods", "-n", NAMESPACE, "-l", WEBHOOK)["items"]
            if not pod["metadata"].get("deletionTimestamp")]


def _evict(api: Api, name: str) -> tuple[int, str]:
    status, answer = api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/eviction",
                                 {"apiVersion": "policy/v1", "kind": "Eviction",
                                  "metadata": {"name": name, "namespace": NAMESPACE}})
    return status, answer.get("message", "")


def test_a_webhook_pod_evicted_while_pods_are_created_denies_none(faults: Cluster) -> None:
    """Of the two replicas one is evicted a quarter into the stream; the PodDisruptionBudget
    refuses the other's eviction, so a replica serves throughout and every pod is admitted,
    reviewed. The stream is paced (10 pods a second) so that it lasts until the evicted pod
    is gone: unpaced, the 200 pods take under 3 s on the 2-core CI machine, less than the
    pod takes to end."""
    first, second = (pod["metadata"]["name"] for pod in _webhook_pods(faults))
    reviewed = faults.webhook_reviews(first)
    api = faults.api()
    started = time.monotonic()
    stream = Stream(faults, count=STREAM, pause=0.4)
    try:
        stream.wait_for(STREAM // 4)
        reviewed = faults.webhook_reviews(first) - reviewed
        evicted = _evict(api, first)
        refused = _evict(api, second)
        while api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{first}")[0] != 404:
            time.sleep(0.2)
        gone_at = len(stream.created) + len(stream.failed)
    except BaseException:
        stream.stop()
        raise
    finally:
        api.close()
    stream.join()
    took = time.monotonic() - started
    assert evicted[0] == 201, evicted
    assert refused[0] == 429 and "disruption budget" in refused[1], refused
    assert reviewed > 0  # the apiserver sent the evicted pod reviews of the stream
    assert gone_at < STREAM  # and the stream went on after the pod was gone
    assert stream.failed == [], f"{len(stream.failed)} of {STREAM} denied in {took:.0f} s"
    pods = faults.get("pods", "-n", FAULTS)["items"]
    assert len(pods) == STREAM
    assert all(pod["spec"]["runtimeClassName"] == "vcuda" for pod in pods)  # all reviewed
    faults.ok("rollout", "status", "-n", NAMESPACE, "deployment/vcuda-webhook",
              "--timeout=180s")


def _advertised(api: Api) -> tuple[str, str]:
    status, node = api.request("GET", f"/api/v1/nodes/{NODE}")
    allocatable = node["status"]["allocatable"] if status == 200 else {}
    return (allocatable.get("docker.com/vcuda-core", ""),
            allocatable.get("docker.com/vcuda-memory", ""))


def _limited_pod(image: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "limited", "namespace": "default"},
                       "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                           "name": "main", "image": image, "imagePullPolicy": "Never",
                           "command": ["sleep", "3600"],
                           "resources": {"limits": {"docker.com/vcuda-core": "50",
                                                    "docker.com/vcuda-memory": "8"}}}]}})


def test_the_node_agent_deleted_keeps_the_nodes_resources_and_the_containers_limits(
        vcuda: Cluster) -> None:
    """While the agent's pod is gone and its replacement starts, the Node keeps advertising
    vcuda's resources (sampled every 0.2 s), and a running limited container keeps its
    limits file, unchanged, in the same container."""
    expected = ("200", str(sum(GPUS_MIB) // 256))
    vcuda.ok("apply", "-f", "-", stdin=_limited_pod(vcuda.vcuda_image()))
    try:
        vcuda.ok("wait", "pod/limited", "--for=jsonpath={.status.phase}=Running",
                 "--timeout=120s")
        limits = vcuda.ok("exec", "limited", "--", "cat", "/etc/vcuda/limits")
        container = vcuda.get("pod", "limited")["status"]["containerStatuses"][0]["containerID"]
        samples: list[tuple[str, str]] = []
        done = threading.Event()

        def sample() -> None:
            api = vcuda.api()
            while not done.wait(0.2):
                samples.append(_advertised(api))
            api.close()

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            vcuda.ok("delete", "pod", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=vcuda-node",
                     "--wait=true")
            vcuda.ok("rollout", "status", "-n", NAMESPACE, "daemonset/vcuda-node",
                     "--timeout=180s")
        finally:
            done.set()
            sampler.join()
        assert samples and set(samples) == {expected}, sorted(set(samples))
        assert limits.strip()
        assert vcuda.ok("exec", "limited", "--", "cat", "/etc/vcuda/limits") == limits
        after = vcuda.get("pod", "limited")["status"]["containerStatuses"][0]
        assert (after["containerID"], after["restartCount"]) == (container, 0)
    finally:
        vcuda.ok("delete", "pod", "limited", "--wait=true")


def _renew_serving_job(cluster: Cluster) -> str:
    """The rotation CronJob's Job run now with ``--renew-serving``, by docs/CERTIFICATES.md's
    commands."""
    name = "vcuda-certs-renew"
    job = cluster.ok("-n", NAMESPACE, "create", "job", name, "--from=cronjob/vcuda-certs-rotate",
                     "--dry-run=client", "-o", "json")
    patched = cluster.ok("patch", "--local", "-f", "-", "--type=json", "-o", "json", "-p",
                         '[{"op": "add", "path": "/spec/template/spec/containers/0/args/-", '
                         '"value": "--renew-serving"}]', stdin=job)
    cluster.ok("create", "-f", "-", stdin=patched)
    return name


def _served_certificate(pod: dict) -> bytes:
    """The certificate the webhook pod serves now (DER), read from its port on the bridge."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((pod["status"]["podIP"], 8443), timeout=10) as raw, \
            context.wrap_socket(raw) as tls:
        certificate = tls.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


def test_the_serving_certificate_renewed_while_reviews_flow_fails_none(faults: Cluster) -> None:
    """Pods are created in a loop (each reviewed by the webhook, the apiserver its client)
    from before the renewal until each webhook pod serves the new certificate: none fails.
    The Job waits until its CA has been in caBundle for --propagation (180 s), so soon after
    the install it takes up to that; then the kubelet's sync brings the files (about a
    minute here): 2 to 4 minutes in all."""
    secret = faults.get("secret", "vcuda-webhook-tls", "-n", NAMESPACE)
    stream = Stream(faults, workers=2, dry_run=True, pause=0.1)
    job = ""
    try:
        job = _renew_serving_job(faults)
        faults.ok("wait", "-n", NAMESPACE, f"job/{job}", "--for=condition=Complete",
                  "--timeout=240s", timeout=270)
        renewed = faults.get("secret", "vcuda-webhook-tls", "-n", NAMESPACE)
        assert renewed["data"]["tls.crt"] != secret["data"]["tls.crt"]
        new = ssl.PEM_cert_to_DER_cert(base64.b64decode(renewed["data"]["tls.crt"]).decode())
        deadline = time.monotonic() + 240
        while {_served_certificate(pod) for pod in _webhook_pods(faults)} != {new}:
            assert time.monotonic() < deadline, "the webhook pods do not serve the new " \
                "certificate"
            time.sleep(2)
        served = len(stream.created)
        time.sleep(3)  # reviews on the new certificate too
    finally:
        stream.stop()
        if job:
            faults.ok("delete", "job", job, "-n", NAMESPACE, "--wait=true")
    assert len(stream.created) > served
    assert stream.failed == [], f"{len(stream.failed)} of " \
        f"{len(stream.failed) + len(stream.created)} failed"
