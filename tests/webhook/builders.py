"""Pods and AdmissionReviews as the API server sends them, built for tests."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from webhook.pod import Pod


def container(name: str = "main", limits: dict[str, Any] | None = None,
              requests: dict[str, Any] | None = None,
              security_context: dict[str, Any] | None = None) -> dict[str, Any]:
    """A container; ``limits``/``requests`` go into its resources."""
    result: dict[str, Any] = {"name": name, "image": "registry.example/app:1"}
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    if resources:
        result["resources"] = resources
    if security_context is not None:
        result["securityContext"] = security_context
    return result


def shared(name: str = "main", cores: Any = "30", memory: Any = "40",
           domain: str = "docker.com", **extra: Any) -> dict[str, Any]:
    """A container that asks for a share of a GPU."""
    limits = {"cpu": "1", f"{domain}/vcuda-core": cores, f"{domain}/vcuda-memory": memory}
    return container(name, limits=limits, **extra)


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
        annotations: dict[str, str] | None = None, runtime_class: str | None = None,
        name: str | None = None, generate_name: str | None = "trainer-") -> dict[str, Any]:
    """A pod as a controller creates it: a generateName and no name, unless given."""
    metadata: dict[str, Any] = {"namespace": "ml", "labels": {"app": "trainer"}}
    if name is not None:
        metadata["name"] = name
    elif generate_name is not None:
        metadata["generateName"] = generate_name
    if annotations is not None:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {"containers": list(containers), "restartPolicy": "Never"}
    if init:
        spec["initContainers"] = list(init)
    if runtime_class is not None:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def review(obj: Any, operation: str = "CREATE", old: Any = None, uid: str | None = None,
           dry_run: bool = False, namespace: str = "ml",
           kind: dict[str, str] | None = None) -> dict[str, Any]:
    """An admission.k8s.io/v1 AdmissionReview request for ``obj``."""
    kind = kind or {"group": "", "version": "v1", "kind": "Pod"}
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()), "kind": kind,
            "resource": {"group": kind["group"], "version": kind["version"],
                         "resource": kind["kind"].lower() + "s"},
            "namespace": namespace, "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": obj, "oldObject": old, "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def as_pod(obj: dict[str, Any]) -> Pod:
    """The typed pod the policy reviews, as the server decodes it."""
    return msgspec.convert(obj, Pod)


def encode(value: Any) -> bytes:
    return msgspec.json.encode(value)
