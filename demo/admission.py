"""The demo's admission side: the real vcuda-webhook on loopback, sent pods as by the API server."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import jsonpatch

from demo.commands import REPO, vcuda_command
from demo.steps import DemoError
from webhook.pki import write_self_signed

HOST = "127.0.0.1"
_READY_WITHIN = 30.0  # seconds; the server imports aiohttp and friends first
_STOP_WITHIN = 10.0
_POD = {"group": "", "version": "v1", "kind": "Pod"}
_PODS = {"group": "", "version": "v1", "resource": "pods"}


class WebhookFailed(DemoError):
    """The webhook did not start, or answered what the API server could not use."""


class Review(NamedTuple):
    """The webhook's answer to one pod, and the pod with its patch applied."""

    allowed: bool
    message: str
    warnings: tuple[str, ...]
    patch: list[dict[str, Any]]
    pod: dict[str, Any]


def admission_review(pod: dict[str, Any], uid: str) -> dict[str, Any]:
    """The AdmissionReview v1 that the API server sends for the creation of ``pod``."""
    metadata = pod["metadata"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": _POD,
            "resource": _PODS,
            "requestKind": _POD,
            "requestResource": _PODS,
            "name": metadata.get("name", ""),
            "namespace": metadata.get("namespace", "default"),
            "operation": "CREATE",
            "userInfo": {"username": "demo-user", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


class Webhook:
    """A vcuda-webhook process on loopback, and an HTTPS client that trusts only its CA."""

    def __init__(self, work: Path) -> None:
        self.ca_file, cert_file, key_file = write_self_signed(work)
        self.port = _free_port()
        self.log_file = work / "webhook.log"
        self.command = [*vcuda_command("vcuda-webhook", "webhook.server"),
                        "--host", HOST, "--port", str(self.port),
                        "--cert-file", str(cert_file), "--key-file", str(key_file)]
        self._tls = ssl.create_default_context(cafile=str(self.ca_file))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> None:
        """Start the server and wait until /readyz answers over verified TLS."""
        with open(self.log_file, "wb") as log:
            # A session of its own: a Ctrl-C meant for the demo reaches it only through stop().
            self._process = subprocess.Popen(self.command, cwd=REPO, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + _READY_WITHIN
        while True:
            if self._process.poll() is not None:
                raise WebhookFailed(f"vcuda-webhook exited with status {self._process.returncode}"
                                   f" before it was ready; its last output: {self.last_output()}")
            try:
                status, _ = self._request("GET", "/readyz")
            except (OSError, http.client.HTTPException) as exc:
                if time.monotonic() > deadline:
                    raise WebhookFailed(f"vcuda-webhook did not answer on {self.url} within "
                                       f"{_READY_WITHIN:.0f} s ({exc})") from None
                time.sleep(0.1)
                continue
            if status == 200:
                return
            raise WebhookFailed(f"vcuda-webhook's /readyz answered HTTP {status}")

    def review(self, pod: dict[str, Any]) -> Review:
        """Send the creation of ``pod`` to /mutate and apply the JSON Patch it answers."""
        uid = str(uuid.uuid4())
        body = json.dumps(admission_review(pod, uid)).encode()
        status, answer = self._request("POST", "/mutate?timeout=10s", body)
        if status != 200:
            raise WebhookFailed(f"/mutate answered HTTP {status}: {answer[:300]!r}")
        response = json.loads(answer)["response"]
        if response.get("uid") != uid:
            raise WebhookFailed(f"the answer's uid {response.get('uid')!r} is not the request's")
        patch: list[dict[str, Any]] = []
        if "patch" in response:
            if response.get("patchType") != "JSONPatch":
                raise WebhookFailed(f"patchType is {response.get('patchType')!r}, not JSONPatch")
            patch = json.loads(base64.b64decode(response["patch"]))
        return Review(
            allowed=response["allowed"] is True,
            message=response.get("status", {}).get("message", ""),
            warnings=tuple(response.get("warnings") or ()),
            patch=patch,
            pod=jsonpatch.apply_patch(pod, patch) if patch else pod,
        )

    def stop(self) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s); return its exit status."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(_STOP_WITHIN)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return process.returncode

    def last_output(self, lines: int = 3) -> str:
        """The last lines the server wrote, for an error message."""
        try:
            text = self.log_file.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(none)"
        return " | ".join(text[-lines:]) or "(none)"

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        connection = http.client.HTTPSConnection(HOST, self.port, context=self._tls, timeout=10)
        try:
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


def _free_port() -> int:
    """A loopback port that no one listens on now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]
