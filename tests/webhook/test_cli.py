"""The vcuda-webhook command: its help, its start-up errors, and serving until SIGTERM."""

from __future__ import annotations

import base64
import json
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.webhook.builders import pod, review, shared
from tests.webhook.conftest import SecretVolume

COMMAND = str(Path(sys.executable).parent / "vcuda-webhook")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMMAND, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_help_explains_every_flag() -> None:
    result = run("--help")
    assert result.returncode == 0
    for flag in ("--host", "--port", "--cert-file", "--key-file", "--self-signed", "--config",
                 "--reload-interval", "--kubeconfig", "--nodes-interval"):
        assert flag in result.stdout
    assert "POST /mutate" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    ((), "give --cert-file and --key-file, or --self-signed to try it locally"),
    (("--cert-file", "tls.crt"), "--cert-file and --key-file go together"),
    (("--self-signed", "--cert-file", "tls.crt"), "give --cert-file and --key-file, or"),
    (("--self-signed", "--reload-interval", "0"),
     "argument --reload-interval: '0' is not a number of seconds more than 0"),
    (("--self-signed", "--reload-interval", "nan"), "argument --reload-interval: 'nan' is not"),
    (("--self-signed", "--reload-interval", "inf"), "argument --reload-interval: 'inf' is not"),
    (("--self-signed", "--port", "nan"), "argument --port: 'nan' is not a port: write 1..65535"),
    (("--self-signed", "--port", "99999"), "argument --port: '99999' is not a port"),
    (("--self-signed", "--port", "-1"), "argument --port: '-1' is not a port"),
    (("--self-signed", "--nodes-interval", "0"),
     "argument --nodes-interval: '0' is not a number of seconds more than 0"),
    (("--self-signed", "--kubeconfig", "/nonexistent/kubeconfig"),
     "--kubeconfig: no Kubernetes credentials: /nonexistent/kubeconfig is not a file"),
])
def test_wrong_flags_are_refused_with_what_to_give(args: tuple[str, ...], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert f"vcuda-webhook: error: {message}" in result.stderr


def test_a_bad_config_file_stops_the_start_with_the_key_named(tmp_path: Path) -> None:
    config = tmp_path / "vcuda.json"
    config.write_text('{"runtime_clas": "vcuda"}')
    result = run("--self-signed", "--config", str(config))
    assert result.returncode == 2
    assert f"--config {config}: unknown key 'runtime_clas'; known keys: domains" in result.stderr


def test_an_unusable_certificate_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    result = run("--cert-file", str(tmp_path / "tls.crt"), "--key-file", str(tmp_path / "tls.key"))
    assert result.returncode == 2
    assert "the certificate file holds no PEM certificate" in result.stderr


def test_a_port_in_use_stops_the_start_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("--self-signed", "--host", "127.0.0.1", "--port", str(port))
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"vcuda-webhook: error: cannot listen on 127.0.0.1 port {port}: Address already in use; "
        "give a free --port and a --host that is an address of this machine")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("host", ["no-such-host.invalid", "192.0.2.1"])
def test_a_host_that_is_not_an_address_here_stops_the_start_with_one_line(host: str) -> None:
    result = run("--self-signed", "--host", host, "--port", "0")
    assert result.returncode == 1
    assert f"vcuda-webhook: error: cannot listen on {host} port 0: " in result.stderr
    assert "Traceback" not in result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Process:
    """vcuda-webhook running as its own process, with its JSON log lines."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [COMMAND, "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.logs: list[dict[str, Any]] = []
        while not any(entry["event"] == "serving" for entry in self.logs):
            line = self.process.stdout.readline()
            assert line, self.process.stderr.read().decode()
            self.logs.append(json.loads(line))

    def get(self, path: str, context: ssl.SSLContext, body: bytes | None = None) -> bytes:
        url = f"https://127.0.0.1:{self.port}{path}"
        deadline = time.monotonic() + 10
        while True:  # the port opens just after the "serving" line
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=body),
                                            context=context, timeout=5) as response:
                    return response.read()
            except urllib.error.URLError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self.process.stdout.close()
        self.process.stderr.close()
        return code


def test_self_signed_serves_with_a_ca_it_names_and_stops_cleanly_on_sigterm() -> None:
    server = Process("--self-signed")
    try:
        (hint,) = [entry for entry in server.logs if entry["event"] == "self_signed"]
        ca_file = Path(hint["ca_file"])
        assert server.get("/healthz", ssl.create_default_context(cafile=ca_file)) == b"ok\n"
    finally:
        assert server.stop() == 0
    assert not ca_file.exists()  # the throwaway certificates go with the process


def test_certificate_files_and_config_are_used(tmp_path: Path, secret: SecretVolume,
                                               client_context: ssl.SSLContext) -> None:
    config = tmp_path / "vcuda.json"
    config.write_text('{"runtime_class": "gpu-share"}')
    server = Process("--cert-file", str(secret.cert_file), "--key-file", str(secret.key_file),
                     "--config", str(config))
    try:
        answer = json.loads(server.get("/mutate", client_context,
                                       json.dumps(review(pod(shared("train")))).encode()))
    finally:
        assert server.stop() == 0
    assert answer["response"]["allowed"] is True
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "gpu-share"} in patch
    (serving,) = [entry for entry in server.logs if entry["event"] == "serving"]
    assert serving["loop"] == "uvloop"  # its C TLS and loop are a fifth of a review's cost
