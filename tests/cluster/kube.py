"""The tests' handle on the cluster: kubectl with the admin kubeconfig (or another)."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


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

    def vcuda_image(self) -> str:
        """vcuda's image as installed (Debian: the fake driver's probe needs its C library)."""
        deployment = self.get("deployment", "vcuda-webhook", "-n", "vcuda-system")
        return deployment["spec"]["template"]["spec"]["containers"][0]["image"]
