"""The Dockerfile built with podman on a Debian 12 root that mmdebstrap assembles from Debian's
packages (no registry is reached): a fresh tag, or one named by the content of the build's
inputs, which a later build of the same inputs reuses.

The build runs its stages as written (apt-get, pip from PyPI, make); it only
trusts what this machine trusts (a proxy's CA, where there is one), mounted
for the build and not kept.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import ssl
import subprocess
import tempfile
from pathlib import Path

from tests.podman import LIMITS, PODMAN

ROOT = Path(__file__).resolve().parents[2]
BASE = "localhost/vcuda-test-debian:bookworm"  # debian:bookworm-slim's equivalent
CACHED = "localhost/vcuda-test/vcuda"  # tagged with the inputs' digest
_BUILD_CA = "/run/vcuda-build/ca.crt"
# What the Dockerfile copies (its COPY lines), less what .dockerignore leaves out.
_INPUTS = ("Dockerfile", ".dockerignore", "requirements/build.txt", "requirements/runtime.txt",
           "cshim", "pyproject.toml", "setup.cfg", "README.md", "webhook", "runtime_hook",
           "extender", "manifests/node")
_IGNORED_DIRS = ("__pycache__", "build")  # cshim/build is in .dockerignore
_IGNORED_SUFFIX = ".egg-info"


class BuildError(RuntimeError):
    """The image build failed; the message holds the end of its output."""


def _base_image(scratch: Path) -> str:
    """Debian 12 minbase from Debian's packages, imported once as BASE."""
    if subprocess.run(["podman", "image", "exists", BASE]).returncode == 0:
        return BASE
    if not shutil.which("mmdebstrap"):
        raise BuildError("mmdebstrap is missing: run scripts/setup")
    tar = scratch / "bookworm.tar"
    subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", "--format=tar", "bookworm",
                    str(tar)], check=True, timeout=600)
    subprocess.run(["podman", "import", "-q", str(tar), BASE], check=True, capture_output=True,
                   timeout=300)
    return BASE


def _trust_mounts(scratch: Path) -> list[str]:
    """Build-time mounts that make pip trust the CAs this machine trusts."""
    paths = ssl.get_default_verify_paths()
    bundle = os.path.realpath(paths.cafile or paths.openssl_cafile)
    pip_conf = scratch / "pip.conf"
    pip_conf.write_text(f"[global]\ncert = {_BUILD_CA}\n")
    return ["--volume", f"{bundle}:{_BUILD_CA}:ro", "--volume", f"{pip_conf}:/etc/pip.conf:ro"]


def build(tag: str) -> str:
    """Build the Dockerfile of this checkout as ``tag``; return the tag."""
    with tempfile.TemporaryDirectory(prefix="vcuda-image-") as scratch_dir:
        scratch = Path(scratch_dir)
        result = subprocess.run(
            [*PODMAN, "build", "--pull=never", "--network=host", *LIMITS, *_trust_mounts(scratch),
             "--build-arg", f"BASE={_base_image(scratch)}", "--tag", tag, "--file",
             str(ROOT / "Dockerfile"), str(ROOT)],
            capture_output=True, text=True, timeout=1500)
    if result.returncode != 0:
        raise BuildError(f"the image build failed:\n{result.stdout[-4000:]}\n"
                         f"{result.stderr[-4000:]}")
    return tag


def inputs_digest() -> str:
    """A digest of every file the build copies in (paths and contents)."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for name in _INPUTS:
        path = ROOT / name
        if path.is_file():
            files.append(path)
            continue
        for directory, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in _IGNORED_DIRS
                             and not d.endswith(_IGNORED_SUFFIX))
            files += [Path(directory) / n for n in names]
    for file in sorted(files):
        digest.update(f"{file.relative_to(ROOT)}\0{file.stat().st_size}\0".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def cached() -> str:
    """The image of this checkout's inputs: built once, reused while they do not change."""
    tag = f"{CACHED}:{inputs_digest()}"
    if subprocess.run(["podman", "image", "exists", tag]).returncode == 0:
        return tag
    return build(tag)
