"""Loading the kustomize manifests of `manifests/` (the node runtime config in `manifests/node/`
aside): the files their kustomizations list, and what `kubectl kustomize` builds of each path."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.upstream import upstream

ROOT = Path(__file__).resolve().parents[2] / "manifests"
BASE = ROOT / "base"
KUBERNETES_VERSION = "1.33"  # the schemas every manifest must validate against, strictly
# Each install path, as the folder that renders it whole.
PATHS = {
    "nvidia-device-plugin": ROOT,
    "placement": ROOT / "placement",
    "placement-self-managed": ROOT / "placement" / "self-managed",
    "dra": ROOT / "dra",
}
# kubectl as scripts/build-upstream built it (the version the real cluster runs), else one
# installed here; Debian does not package it.
KUBECTL = upstream("kubectl") or shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None,
    reason="kubectl is neither built (scripts/build-upstream, where Go is installed) nor "
           "installed; the kustomize builds are checked where it is present")


def kustomizations() -> list[Path]:
    """Every kustomization (and component) file under manifests/."""
    return sorted(ROOT.rglob("kustomization.yaml"))


def manifest_files() -> list[Path]:
    """Every file of objects that a kustomization under manifests/ lists in its resources."""
    files = set()
    for kustomization in kustomizations():
        for entry in yaml.safe_load(kustomization.read_text()).get("resources", []):
            path = (kustomization.parent / entry).resolve()
            if path.is_file():
                files.add(path)
    return sorted(files)


def documents(path: Path) -> list[dict[str, Any]]:
    """The objects of one YAML file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_objects() -> list[dict[str, Any]]:
    """Every object of every manifest file."""
    return [d for p in manifest_files() for d in documents(p)]


def find(kind: str, name: str) -> dict[str, Any]:
    """The one object of ``kind`` named ``name``."""
    matches = [o for o in all_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


def build(folder: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl kustomize` of ``folder``, as it ended."""
    return subprocess.run([str(KUBECTL), "kustomize", str(folder)], capture_output=True, text=True,
                          check=False, timeout=120)


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` builds of ``folder``."""
    built = build(folder)
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]
