"""Loading the manifests of `manifests/` (the node runtime config in `manifests/node/` aside)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2] / "manifests"
KUBERNETES_VERSION = "1.33"  # the schemas every manifest must validate against, strictly


def manifest_files() -> list[Path]:
    """Every Kubernetes manifest file of the kustomization's folder."""
    return sorted(p for p in ROOT.glob("*.yaml") if p.name != "kustomization.yaml")


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
