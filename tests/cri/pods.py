"""Pods and containers of the CRI tests: the node's made-up GPUs, pods placed on one, and
reading what a container sees or why it was refused."""

from __future__ import annotations

import pytest

from runtime_hook.contract import ASSIGNMENT_ANNOTATION, Gpu
from runtime_hook.placement import Assignment, encode_assignment
from tests.cri.client import CriError, Pod
from tests.cri.node import ContainerdNode
from tests.hook.bundles import limits_annotation

GIB = 1 << 30
GPUS = [Gpu(f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}", i, 8 * GIB) for i in range(2)]
SLEEP = ["sleep", "600"]


def read(node: ContainerdNode, container: str, path: str) -> str | None:
    """The file at ``path`` in the running container, or None when it has none."""
    answer = node.cri.exec(container, "cat", path)
    return answer.stdout.decode() if answer.exit_code == 0 else None


def placed_pod(node: ContainerdNode, name: str, gpu: int) -> Pod:
    """A pod with a 30% / 2 GiB ``worker`` that vcuda's scheduler bound to GPU ``gpu``."""
    placed = Assignment((GPUS[gpu].uuid, 30, 2 * GIB), ())
    return node.cri.run_pod(name, {**limits_annotation(worker=(30, 2 * GIB)),
                                   ASSIGNMENT_ANNOTATION: encode_assignment(placed)})


def refused(node: ContainerdNode, pod: Pod, **options: object) -> tuple[str, str]:
    """Start a ``worker`` in ``pod`` with ``options``, which the hook refuses: its id, and the
    hook's line as the CRI error carries it (after runc's and containerd's words)."""
    container = node.cri.create(pod, "worker", SLEEP, **options)  # type: ignore[arg-type]
    with pytest.raises(CriError) as caught:
        node.cri.start(container)
    [line] = [line for line in caught.value.details.splitlines() if "vcuda-hook:" in line]
    status = node.cri.status(container)
    assert (status.reason, status.started_at) == ("StartError", 0), status  # it never ran
    hook_line = line[line.index("vcuda-hook:"):].removesuffix(": unknown")  # containerd's code
    assert hook_line in status.message  # what the pod's status shows
    return container, hook_line
