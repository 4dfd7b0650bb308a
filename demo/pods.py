"""The demo's sample pods, and what the webhook should make of each."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runtime_hook.contract import LIMITS_ANNOTATION

NAMESPACE = "demo"
GIB = 1 << 30


@dataclass(frozen=True)
class SamplePod:
    """A pod a user could write, and the webhook's expected answer.

    Attributes:
        about: what the pod asks for, in a few words.
        pod: the Pod object as the API server holds it before admission.
        allowed: whether the webhook should admit it.
        limits: the expected ``vcuda.io/limits`` value (None: no annotation).
        runtime_class: the expected ``spec.runtimeClassName``.
        resources: per container, limits the admitted pod must hold.
    """

    about: str
    pod: dict[str, Any]
    allowed: bool
    limits: dict[str, dict[str, int]] | None = None
    runtime_class: str | None = None
    resources: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]


def _pod(name: str, container: str, limits: dict[str, str],
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NAMESPACE}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": container, "image": "python:3.12",
                                 "resources": {"limits": limits}}]},
    }


SAMPLES = (
    SamplePod(
        about="30% / 10 GiB of one GPU",
        pod=_pod("shared-notebook", "notebook",
                 {"docker.com/vcuda-core": "30", "docker.com/vcuda-memory": "40"}),
        allowed=True,
        limits={"notebook": {"cores": 30, "memory": 10 * GIB}},
        runtime_class="vcuda",
        resources={"notebook": {"nvidia.com/gpu.shared": "1"}},
    ),
    SamplePod(
        about="2 whole GPUs",
        pod=_pod("exclusive-training", "trainer", {"docker.com/vcuda-core": "200"}),
        allowed=True,
        resources={"trainer": {"nvidia.com/gpu": "2"}},
    ),
    SamplePod(
        about="vcuda-core 150: neither a share nor whole GPUs",
        pod=_pod("invalid-request", "main",
                 {"docker.com/vcuda-core": "150", "docker.com/vcuda-memory": "40"}),
        allowed=False,
    ),
    SamplePod(
        about="10% / 1 GiB, forges a 99% / 80 GiB annotation",
        pod=_pod("forged-limits", "app",
                 {"docker.com/vcuda-core": "10", "docker.com/vcuda-memory": "4"},
                 # The tenant's own text: the demo's check must run on a bare Python.
                 {LIMITS_ANNOTATION: json.dumps({"app": {"cores": 99, "memory": 80 * GIB}})}),
        allowed=True,
        limits={"app": {"cores": 10, "memory": GIB}},
        runtime_class="vcuda",
        resources={"app": {"nvidia.com/gpu.shared": "1"}},
    ),
)
