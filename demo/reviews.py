"""What the demo shows of each review, and how it differs from what the sample pod expects."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from demo.pods import GIB, SamplePod
from runtime_hook.contract import LIMITS_ANNOTATION

if TYPE_CHECKING:  # the demo imports demo.admission only once its modules are known present
    from demo.admission import Review


def limits_annotation(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's vcuda.io/limits, parsed; {} when absent."""
    value = (pod["metadata"].get("annotations") or {}).get(LIMITS_ANNOTATION)
    return json.loads(value) if value else {}


def limits_text(limits: dict[str, int]) -> str:
    """``{"cores": 30, "memory": 10 GiB}`` as ``30% / 10 GiB``."""
    return f"{limits['cores']}% / {limits['memory'] / GIB:g} GiB"


def _resources_text(container: dict[str, Any]) -> str:
    limits = container.get("resources", {}).get("limits", {})
    return ", ".join(f"{key}: {value}" for key, value in limits.items())


def review_lines(asked: dict[str, Any], review: Review) -> list[str]:
    """What the pod asked for, and the webhook's answer: message, or warnings, patch, result."""
    lines = [f"asks:     {c['name']}: {_resources_text(c)}" for c in asked["spec"]["containers"]]
    written = (asked["metadata"].get("annotations") or {}).get(LIMITS_ANNOTATION)
    if written:
        lines.append(f"          and writes {LIMITS_ANNOTATION}: {written}")
    if not review.allowed:
        return [*lines, f"message:  {review.message}"]
    lines += [f"warning:  {warning}" for warning in review.warnings]
    for number, op in enumerate(review.patch):
        value = f" {json.dumps(op['value'])}" if "value" in op else ""
        lines.append(f"{'patch:' if number == 0 else '':<10}{op['op']} {op['path']}{value}")
    pod = review.pod
    lines += [f"{'patched:' if number == 0 else '':<10}{c['name']}: {_resources_text(c)}"
              for number, c in enumerate(pod["spec"]["containers"])]
    written = (pod["metadata"].get("annotations") or {}).get(LIMITS_ANNOTATION)
    lines.append(f"          {LIMITS_ANNOTATION}: {written or '(none)'}")
    lines.append(f"          runtimeClassName: {pod['spec'].get('runtimeClassName') or '(none)'}")
    return lines


def unexpected(sample: SamplePod, review: Review) -> str:
    """What in the review differs from the sample's expectations; '' when nothing."""
    if review.allowed != sample.allowed:
        return f"{'admitted' if review.allowed else 'denied'}, expected the opposite"
    if not review.allowed:
        return "" if review.message else "denied without a message"
    if limits_annotation(review.pod) != (sample.limits or {}):
        return f"{LIMITS_ANNOTATION} is {limits_annotation(review.pod)}, expected {sample.limits}"
    if review.pod["spec"].get("runtimeClassName") != sample.runtime_class:
        return f"runtimeClassName is {review.pod['spec'].get('runtimeClassName')!r}"
    containers = {c["name"]: c for c in review.pod["spec"]["containers"]}
    for name, wanted in sample.resources.items():
        limits = containers[name].get("resources", {}).get("limits", {})
        for key, value in wanted.items():
            if limits.get(key) != value:
                return f"{name}'s limits have {key}: {limits.get(key)}, expected {value}"
    return ""


def admitted_summary(sample: SamplePod) -> str:
    """One line on what the webhook's patch gives the admitted sample pod."""
    adds = [f"{key}: {value}" for wanted in sample.resources.values()
            for key, value in wanted.items()]
    if sample.limits:
        adds.append(LIMITS_ANNOTATION)
    if sample.runtime_class:
        adds.append(f"runtime class {sample.runtime_class}")
    listed = adds[0] if len(adds) == 1 else ", ".join(adds[:-1]) + " and " + adds[-1]
    summary = "admitted; the patch adds " + listed
    if limits_annotation(sample.pod):
        summary += ", replacing the forged annotation"
    return summary
