"""The tests' handle on the cluster: kubectl with the admin kubeconfig (or another)."""

from __future__ import annotations

import http.client
import json
import re
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Cluster:
    """The cluster ``scripts/cluster up`` started: its admin kubeconfig, its kubectl, whether
    vcuda is installed on it."""

    kubeconfig: Path
    kubectl_path: Path
    with_vcuda: bool = False

    def kubectl(self, *args: str, stdin: str | None = None,
                timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """kubectl ARGS as the cluster's admin; output captured, never raises on failure."""
        return subprocess.run([str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig),
                               *args], input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def as_token(self, token: str, *args: str,
                 stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl ARGS as the holder of ``token`` (no admin certificate offered)."""
        config = json.loads(self.kubeconfig.read_text())["clusters"][0]["cluster"]
        return subprocess.run([str(self.kubectl_path), "--kubeconfig", "/dev/null", "--server",
                               config["server"], "--certificate-authority",
                               config["certificate-authority"], "--token", token, *args],
                              input=stdin, capture_output=True, text=True, timeout=180,
                              check=False)

    def api(self) -> Api:
        """A connection of the admin's to the apiserver, for many requests in a row (one
        kubectl a request is most of this machine's CPU)."""
        return Api(json.loads(self.kubeconfig.read_text()))

    def ok(self, *args: str, stdin: str | None = None, timeout: float = 180) -> str:
        """kubectl ARGS that must succeed; its standard output."""
        result = self.kubectl(*args, stdin=stdin, timeout=timeout)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    def get(self, *args: str) -> dict:
        """An object (or list) as JSON."""
        return json.loads(self.ok("get", *args, "-o", "json"))

    def events(self, name: str, needle: str, timeout: float = 120,
               namespace: str = "default") -> str:
        """The messages of pod ``name``'s events once one of them holds ``needle`` (all of
        them when time runs out), one a line."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.ok("get", "events", "-n", namespace, "--field-selector",
                             f"involvedObject.name={name}", "-o",
                             "jsonpath={range .items[*]}{.message}{'\\n'}{end}")
            if needle in events or time.monotonic() > deadline:
                return events
            time.sleep(1)

    def webhook_reviews(self, pod: str) -> int:
        """Reviews webhook pod ``pod`` answered, from its /metrics through the apiserver."""
        text = self.ok("get", "--raw", f"/api/v1/namespaces/vcuda-system/pods/https:{pod}:8443"
                       "/proxy/metrics")
        return sum(int(float(n)) for n in
                   re.findall(r"^vcuda_webhook_reviews_total\{[^}]*\} (\S+)$", text, re.M))

    def vcuda_image(self) -> str:
        """vcuda's image as installed (Debian: the fake driver's probe needs its C library)."""
        deployment = self.get("deployment", "vcuda-webhook", "-n", "vcuda-system")
        return deployment["spec"]["template"]["spec"]["containers"][0]["image"]


class Api:
    """Requests to the apiserver as the kubeconfig's user, on one kept-alive connection."""

    def __init__(self, kubeconfig: dict) -> None:
        cluster = kubeconfig["clusters"][0]["cluster"]
        user = kubeconfig["users"][0]["user"]
        context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        context.load_cert_chain(user["client-certificate"], user["client-key"])
        server = urlsplit(cluster["server"])
        self._connection = http.client.HTTPSConnection(server.hostname or "", server.port,
                                                       context=context, timeout=60)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """METHOD PATH with ``body`` as JSON: the status and the answer's JSON."""
        self._connection.request(method, path, body=json.dumps(body) if body else None,
                                 headers={"Content-Type": "application/json"})
        answer = self._connection.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")

    def close(self) -> None:
        self._connection.close()
