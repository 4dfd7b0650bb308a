"""Objects of a simulated GPU cluster: nodes with a published GPU inventory, vcuda pods as the
webhook leaves them, and the extender serving in a thread against the fake API server."""

from __future__ import annotations

import asyncio
import http.client
import json
import queue
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from extender.bind import Binder
from extender.node_events import NodeEvents
from extender.nodes import NodeView, NodeWatch
from extender.server import ExtenderServer
from extender.service import Extender
from runtime_hook.contract import (
    ENABLED_LABEL,
    INVENTORY_ANNOTATION,
    SHARED_RESOURCE,
    WHOLE_RESOURCE,
    Gpu,
)
from runtime_hook.placement import encode_inventory
from tests.fake_cluster_api import FakeClusterApi
from webhook.kube import Credentials, Kube
from webhook.logs import make_logger

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30
CORE_KEYS = ("docker.com/vcuda-core", "tencent.com/vcuda-core")
NOW = 1_800_000_000.0
IDLE_SECONDS = 5.0  # a kept-alive connection idle longer is not reused (the server keeps
# one 120 s, as kube-scheduler's 90 s pool expects)


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def node_object(name: str, memories: list[int], heartbeat: float = NOW,
                annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node labelled for vcuda whose agent published GPUs of ``memories`` bytes at
    ``heartbeat``."""
    gpus = [Gpu(gpu_uuid(name, i), i, memory) for i, memory in enumerate(memories)]
    metadata: dict[str, Any] = {"name": name, "labels": {ENABLED_LABEL: "true"},
                "annotations": {INVENTORY_ANNOTATION: encode_inventory(gpus, int(heartbeat))}}
    metadata["annotations"].update(annotations or {})
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": {},
            "status": {"capacity": {"cpu": "64"}, "allocatable": {"cpu": "64"}}}


def pod_object(name: str, cores: int = 0, memory_gib: float = 0, whole: int = 0,
               namespace: str = "team", init: tuple[int, float] | None = None,
               gpus: int = 1) -> dict[str, Any]:
    """A pod as the webhook admits it with vcuda's device plugin resources: a shared container
    (cores, memory on each of ``gpus`` GPUs) and/or whole GPUs."""
    containers, limits_table = [], {}
    if cores:
        containers.append(_container("share", {"docker.com/vcuda-core": str(cores),
                                               "docker.com/vcuda-memory":
                                                   str(int(memory_gib * 4)),
                                               SHARED_RESOURCE: str(gpus)}))
        limits_table["share"] = {"cores": cores, "memory": int(memory_gib * GIB)}
        if gpus > 1:
            limits_table["share"]["gpus"] = gpus
    if whole:
        containers.append(_container("whole", {"docker.com/vcuda-core": str(100 * whole),
                                               WHOLE_RESOURCE: str(whole)}))
    spec: dict[str, Any] = {"containers": containers or [_container("plain", {})],
                            "schedulerName": "vcuda-scheduler"}
    if init:
        spec["initContainers"] = [_container("prepare", {"docker.com/vcuda-core": str(init[0]),
                                                         "docker.com/vcuda-memory":
                                                             str(int(init[1] * 4)),
                                                         SHARED_RESOURCE: "1"})]
        limits_table["prepare"] = {"cores": init[0], "memory": int(init[1] * GIB)}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())}
    if limits_table:
        metadata["annotations"] = {"vcuda.io/limits": json.dumps(limits_table)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _container(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "resources": {"limits": limits}}


def extender_args(pod: dict[str, Any], names: list[str]) -> bytes:
    """ExtenderArgs as kube-scheduler sends them with nodeCacheCapable: true (Go field names:
    the upstream type has no JSON tags; the nil NodeList is null)."""
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


def binding_args(pod: dict[str, Any], node: str) -> bytes:
    metadata = pod["metadata"]
    return json.dumps({"PodName": metadata["name"], "PodNamespace": metadata["namespace"],
                       "PodUID": metadata["uid"], "Node": node}).encode()


def credentials(api: FakeClusterApi) -> Credentials:
    context = ssl.create_default_context(cadata=api.ca.certificate_pem.decode())
    return Credentials(api.url, context, api.token)


class ExtenderClient:
    """Calls one extender as kube-scheduler does: a kept-alive connection per calling thread."""

    port: int

    def __init__(self) -> None:
        self._local = threading.local()
        # Connections of sent() between two requests, and since when (monotonic seconds).
        self._idle: queue.SimpleQueue[tuple[http.client.HTTPConnection, float]] = \
            queue.SimpleQueue()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` on a connection kept per calling thread, as kube-scheduler keeps one;
        a connection the server closed meanwhile is opened again, as Go's client does."""
        for attempt in (1, 2):
            connection = getattr(self._local, "connection", None)
            if connection is None:
                connection = self._local.connection = http.client.HTTPConnection(
                    "127.0.0.1", self.port, timeout=60)
            try:
                connection.request("POST", path, body, {"Content-Type": "application/json"})
                answer = connection.getresponse()
                return answer.status, answer.read()
            except (http.client.HTTPException, OSError):
                connection.close()
                self._local.connection = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def sent(self, path: str, body: bytes) -> Callable[[], bytes]:
        """POST ``body`` now, on a kept-alive connection of a pool, and return what waits for
        the answer's body (an AssertionError unless 200): as kube-scheduler's binding cycle
        sends its bind at once, and the next scheduling cycle goes on meanwhile."""
        connection = None
        while connection is None:
            try:
                connection, since = self._idle.get_nowait()
            except queue.Empty:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            else:
                if time.monotonic() - since > IDLE_SECONDS:
                    connection.close()
                    connection = None
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
        except (http.client.HTTPException, OSError):  # closed by the server meanwhile
            connection.close()
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            connection.request("POST", path, body, {"Content-Type": "application/json"})

        def answer() -> bytes:
            try:
                response = connection.getresponse()
                payload = response.read()
            except BaseException:
                connection.close()
                raise
            self._idle.put((connection, time.monotonic()))
            assert response.status == 200, payload
            return payload
        return answer

    def verb(self, path: str, body: bytes) -> Any:
        return json.loads(self.answer(path, body))

    def answer(self, path: str, body: bytes) -> bytes:
        """The answer's body; an AssertionError unless it is 200."""
        status, payload = self.post(path, body)
        assert status == 200, payload
        return payload


class RunningExtender(ExtenderClient):
    """One vcuda-scheduler-extender on 127.0.0.1 in a thread with its own event loop."""

    def __init__(self, api: FakeClusterApi, log_file: Path, strategy: str = "binpack",
                 max_age: float = 120.0, clock: Any = lambda: NOW,
                 events_interval: float = 60.0) -> None:
        super().__init__()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._log_stream = log_file.open("ab")
        self.port = self.call(self._start(api, strategy, max_age, clock, events_interval))

    async def _start(self, api: FakeClusterApi, strategy: str, max_age: float,
                     clock: Any, events_interval: float) -> int:
        self._kube = Kube(credentials(api))
        self.nodes = NodeView()
        log = make_logger(self._log_stream)
        # The Events' own clock is the real one: their series wait for real intervals.
        self.events = NodeEvents(self._kube, log, interval=events_interval, instance="test")
        binder = Binder(self._kube, self.nodes, CORE_KEYS, strategy, max_age, clock)
        self.extender = Extender(binder, self.nodes, CORE_KEYS, strategy, max_age, clock,
                                 self.events)
        self._server = ExtenderServer(self.extender, NodeWatch(self._kube, self.nodes, log), log,
                                      events=self.events)
        return await self._server.start("127.0.0.1", 0)

    def start_metrics(self) -> int:
        """Open the metrics port (``--metrics-port``) on a free port of 127.0.0.1; return it."""
        return int(self.call(self._server.start_metrics("127.0.0.1", 0)))

    def sync(self, api: FakeClusterApi, timeout: float = 10.0) -> None:
        """Wait until the extender's view of the nodes shows the vcuda nodes as the API holds
        them now (its watch is asynchronous, as kube-scheduler's informers are)."""
        with api.lock:
            wanted = {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                      for p, o in api.objects.items() if p.startswith("/api/v1/nodes/")
                      and (o["metadata"].get("labels") or {}).get(ENABLED_LABEL) == "true"}
        deadline = time.monotonic() + timeout
        while not (self.nodes.ready and all(
                (seen := self.nodes.get(name)) is not None and int(seen.version) >= int(version)
                for name, version in wanted.items())):
            if time.monotonic() > deadline:
                raise AssertionError(f"the extender's view did not catch up with {wanted}")
            time.sleep(0.005)

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=60)

    def stop(self) -> None:
        self.call(self._server.stop())
        self.call(self._kube.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self._log_stream.close()


class ExtenderProcess(ExtenderClient):
    """``vcuda-scheduler-extender`` as its own process, as it runs in a cluster, on 127.0.0.1
    against the API server of ``kubeconfig``; its log lines go to ``log_file``."""

    def __init__(self, kubeconfig: Path, log_file: Path, strategy: str = "binpack",
                 max_age: float = 120.0, timeout: float = 60.0,
                 flags: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.port = free_port()
        with log_file.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "extender.server", "--host", "127.0.0.1", "--port",
                 str(self.port), "--kubeconfig", str(kubeconfig), "--strategy", strategy,
                 "--max-age", str(max_age), *flags],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the extender did not start; its log: {log_file}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self._process.pid

    def _ready(self) -> bool:
        """Whether it answers /readyz: it serves, and has listed the nodes."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
        try:
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200
        except (http.client.HTTPException, OSError):
            return False
        finally:
            connection.close()

    def stop(self) -> None:
        """SIGTERM, as a pod's deletion sends it; it answers what is in progress first."""
        self._process.terminate()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def add(api: FakeClusterApi, *objects: dict) -> list[dict]:
    """Store Nodes and pods ``objects`` in ``api``; return them."""
    for obj in objects:
        if obj["kind"] == "Node":
            api.put(f"/api/v1/nodes/{obj['metadata']['name']}", obj)
        else:
            api.add_pod(obj)
    return list(objects)


def filtered(extender: RunningExtender, api: FakeClusterApi, pod: dict, names: list[str],
             verb: str = "/filter") -> Any:
    """``verb`` (filter or prioritize) once the extender's view shows the nodes as stored."""
    extender.sync(api)
    return extender.verb(verb, extender_args(pod, names))
