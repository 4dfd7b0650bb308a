"""The demo's placement step: the real vcuda-scheduler-extender on loopback, asked as
kube-scheduler asks it where a 10 GiB share goes on a node with a nearly full GPU and a free one.

The extender reads the nodes from the API server (a list, then a watch); a stand-in on loopback
serves it that one node, as the API server would: its metadata, and a watch with nothing new.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from demo.commands import REPO, vcuda_command
from demo.steps import Done, StepFailed
from extender.policy import node_gpus, place, pod_demand
from runtime_hook.contract import (
    ENABLED_LABEL,
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    LIMITS_ANNOTATION,
    SHARED_RESOURCE,
    Gpu,
)
from runtime_hook.placement import Assignment, Entry, encode_inventory, encode_ledger

HOST = "127.0.0.1"
GIB = 1 << 30
_CORE_KEYS = ("docker.com/vcuda-core",)
_READY_WITHIN = 30.0


def _node(now: int) -> dict[str, Any]:
    """A node of two 80 GiB GPUs: GPU 0 holds one 75 GiB share, GPU 1 two of 1 GiB."""
    gpus = [Gpu(f"GPU-demo-{i}", i, 80 * GIB) for i in range(2)]
    ledger = {
        "uid-big": Entry("demo/big-model", now, Assignment(("GPU-demo-0", 20, 75 * GIB), ())),
        "uid-a": Entry("demo/small-a", now, Assignment(("GPU-demo-1", 10, GIB), ())),
        "uid-b": Entry("demo/small-b", now, Assignment(("GPU-demo-1", 10, GIB), ())),
    }
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "gpu-node", "resourceVersion": "1", "labels": {ENABLED_LABEL: "true"},
        "annotations": {INVENTORY_ANNOTATION: encode_inventory(gpus, now),
                        LEDGER_ANNOTATION: encode_ledger(ledger)}}}


def _pod() -> dict[str, Any]:
    """demo/shared-notebook as the webhook leaves it with vcuda's placement configured."""
    limits = {"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "40",
              SHARED_RESOURCE: "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "shared-notebook", "namespace": "demo", "uid": "uid-notebook",
                         "annotations": {LIMITS_ANNOTATION: json.dumps(
                             {"notebook": {"cores": 30, "memory": 10 * GIB}})}},
            "spec": {"containers": [{"name": "notebook", "resources": {"limits": limits}}]}}


def place_on_two_gpus(work: Path) -> Done:
    """Run the step; raise StepFailed when the extender does not keep the node or picks GPU 0."""
    now = int(time.time())
    node, pod = _node(now), _pod()
    with _nodes_api(node) as api_url:
        kubeconfig = work / "extender-kubeconfig"  # bind is not called: nothing is written
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "demo",
            "clusters": [{"name": "demo", "cluster": {"server": api_url}}],
            "users": [{"name": "demo", "user": {"token": "unused"}}],
            "contexts": [{"name": "demo", "context": {"cluster": "demo", "user": "demo"}}]}))
        port = _free_port()
        command = [*vcuda_command("vcuda-scheduler-extender", "extender.server"), "--host",
                   HOST, "--port", str(port), "--kubeconfig", str(kubeconfig)]
        process = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _wait_ready(port, process)
            # As kube-scheduler sends them with nodeCacheCapable: true: the nodes' names.
            args = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": ["gpu-node"]}).encode()
            kept = _post(port, "/filter", args)
            scores = _post(port, "/prioritize", args)
        finally:
            process.terminate()
            process.wait(timeout=10)
    if kept.get("NodeNames") != ["gpu-node"]:
        raise StepFailed(f"the extender did not keep the node: {kept}")
    view = node_gpus("gpu-node", node["metadata"]["annotations"], now, 120)
    chosen = place(view, pod_demand(pod, _CORE_KEYS)).assignment.shared
    if chosen is None or chosen[0] != "GPU-demo-1":
        raise StepFailed(f"vcuda chose {chosen}, not the free GPU-demo-1")
    return Done(
        "a 10 GiB share on a node whose GPU 0 is nearly full: the old path picks GPU 0 and the "
        "pod fails at start; vcuda's extender keeps the node and binds the pod to GPU 1",
        [f"$ {' '.join(command[-6:])}",
         "node:      GPU-demo-0 80 GiB, 1 share given out (75 GiB); GPU-demo-1 80 GiB, "
         "2 shares given out (1 GiB each)",
         "old path:  NVIDIA's time-slicing hands out the GPU with the fewest replicas given "
         "out, GPU-demo-0 (5 GiB free): the hook refuses the 10 GiB container, for good",
         f"vcuda:     POST /filter keeps gpu-node; POST /prioritize scores it "
         f"{scores[0]['Score']}/10; bind records {chosen[0]} (30%, 10 GiB)"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _READY_WITHIN
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StepFailed("vcuda-scheduler-extender exited at start",
                             (process.stderr.read().decode(errors="replace")
                              if process.stderr else "").splitlines()[-5:])
        try:
            connection = http.client.HTTPConnection(HOST, port, timeout=2)
            connection.request("GET", "/readyz")  # serving, and the nodes listed
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise StepFailed(f"vcuda-scheduler-extender was not ready within {_READY_WITHIN:.0f} s")


@contextmanager
def _nodes_api(node: dict[str, Any]) -> Iterator[str]:
    """A stand-in of the API server on loopback serving ``node``'s metadata to a list, and a
    watch that sends nothing until it ends; yields its URL."""
    listed = json.dumps({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                         "metadata": {"resourceVersion": "1"},
                         "items": [{"metadata": node["metadata"]}]}).encode()
    stopping = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not self.path.startswith("/api/v1/nodes?"):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if "watch=true" in self.path:  # nothing changes: hold it open until the end
                self.end_headers()
                stopping.wait()
                return
            self.send_header("Content-Length", str(len(listed)))
            self.end_headers()
            self.wfile.write(listed)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((HOST, 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}"
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()


def _post(port: int, path: str, body: bytes) -> Any:
    connection = http.client.HTTPConnection(HOST, port, timeout=10)
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    answer = connection.getresponse()
    payload = answer.read()
    if answer.status != 200:
        raise StepFailed(f"POST {path} answered {answer.status}: {payload[:200]!r}")
    return json.loads(payload)
