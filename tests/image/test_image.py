"""The Dockerfile, built with podman as tests/image/build.py builds it, and each component of
the image it gives checked inside it. A build that fails fails every test here."""

from __future__ import annotations

import configparser
import hashlib
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.image import build
from tests.podman import LIMITS, PODMAN, require_podman

ROOT = Path(__file__).resolve().parents[2]


def _console_scripts() -> list[str]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    return [line.split("=")[0].strip() for line in lines]


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    require_podman("to build the image")
    tag = f"localhost/vcuda-image-test:{uuid.uuid4().hex[:12]}"
    try:
        build.build(tag)
    except build.BuildError as error:
        pytest.fail(str(error))
    yield tag
    subprocess.run(["podman", "rmi", "--force", tag], capture_output=True, timeout=120)


def _run(image: str, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, "run", "--rm", "--network", "none", *LIMITS, image,
                           *command], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", _console_scripts())
def test_every_console_script_of_the_image_starts(image: str, script: str) -> None:
    result = _run(image, script, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {script}")


def test_libvcuda_is_where_the_installer_takes_it_and_loads(image: str) -> None:
    load = ("import ctypes; lib = ctypes.CDLL('/usr/local/vcuda/lib/libvcuda.so'); "
            "print(bool(lib.cuMemAlloc_v2), bool(lib.nvmlDeviceGetMemoryInfo))")
    result = _run(image, "python3", "-c", load)
    assert (result.returncode, result.stdout) == (0, "True True\n"), result.stderr


def test_the_image_holds_this_checkouts_node_runtime_configuration(image: str) -> None:
    result = _run(image, "sh", "-c", "cd /usr/local/share/vcuda/node && sha256sum *")
    assert result.returncode == 0, result.stderr
    inside = dict(reversed(line.split()) for line in result.stdout.splitlines())
    here = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (ROOT / "manifests" / "node").iterdir()}
    assert inside == here


def _pins(lines: str) -> dict[str, str]:
    """name → version of ``name==version`` lines, names spelled as the locks spell them."""
    found = (line.split(";")[0].split(" ")[0].split("==") for line in lines.splitlines()
             if re.match(r"[A-Za-z0-9]", line) and "==" in line)
    return {name.lower().replace("_", "-"): version for name, version in found}


def test_the_image_holds_exactly_the_libraries_of_its_lock(image: str) -> None:
    # pip is the one Debian's venv puts in; every other library is the lock's.
    result = _run(image, "/opt/vcuda/bin/pip", "list", "--format=freeze", "--exclude", "vcuda",
                  "--exclude", "pip")
    assert result.returncode == 0, result.stderr
    locked = _pins((ROOT / "requirements" / "runtime.txt").read_text())
    assert _pins(result.stdout) == locked


def test_the_image_runs_as_an_unprivileged_user_by_default(image: str) -> None:
    assert _run(image, "id", "-u").stdout == "65532\n"


_SERVE = """
import json, ssl, subprocess, time, urllib.request
server = subprocess.Popen(["vcuda-webhook", "--self-signed", "--port", "8443"],
                          stdout=subprocess.PIPE, text=True)
ca = json.loads(server.stdout.readline())["ca_file"]
context = ssl.create_default_context(cafile=ca)
for _ in range(100):
    try:
        print(urllib.request.urlopen("https://localhost:8443/healthz", context=context).read())
        break
    except OSError:
        time.sleep(0.1)
server.terminate()
"""


def test_the_webhook_of_the_image_serves_over_tls(image: str) -> None:
    result = _run(image, "python3", "-c", _SERVE)
    assert (result.returncode, result.stdout) == (0, "b'ok\\n'\n"), result.stderr
