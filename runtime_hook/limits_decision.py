"""Pure decisions of the hook: whose limits apply, and whether they fit on their GPUs.

No I/O here: the stages feed in annotations and the node's records, and act
on what comes back. Which GPUs a container has is :mod:`runtime_hook.device_assignment`'s.
"""

from __future__ import annotations

# collections.abc re-exports these from _collections_abc, which os has loaded
# already; importing collections.abc would load all of collections (2 ms).
from _collections_abc import Iterable, Mapping

from runtime_hook.contract import (
    LIMITS_ANNOTATION,
    ContractError,
    Gpu,
    Sharing,
    entry_gpus,
    entry_limits,
    entry_virtual,
    limits_table,
)
from runtime_hook.hook_errors import HookError
from runtime_hook.record import Record

# containerd's key first, then CRI-O's.
NAME_ANNOTATIONS = ("io.kubernetes.cri.container-name", "io.kubernetes.container.name")
SANDBOX_MARKERS = (
    ("io.kubernetes.cri.container-type", "sandbox"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
)

_FIX_ANNOTATION = "let the vcuda webhook write vcuda.io/limits (never edit it by hand)"
_GIB = 1 << 30


class Request(Record):
    """The limits one container asked for: its name, percent of GPU time and bytes of memory
    on each GPU, how many distinct GPUs it shares, and whether it takes virtual memory."""

    _fields = ("container", "cores", "memory", "gpus", "virtual")
    __slots__ = _fields
    _defaults = (1, False)
    container: str
    cores: int
    memory: int
    gpus: int
    virtual: bool


def container_name(annotations: Mapping[str, str]) -> str:
    """The Kubernetes container name the runtime put in the spec, or ''."""
    for key in NAME_ANNOTATIONS:
        if annotations.get(key):
            return annotations[key]
    return ""


def pod_of(annotations: Mapping[str, str]) -> tuple[str, str]:
    """The (namespace, pod name) the runtime put in the spec; empty strings where absent."""
    namespace = annotations.get("io.kubernetes.cri.sandbox-namespace") or annotations.get(
        "io.kubernetes.pod.namespace", ""
    )
    pod = annotations.get("io.kubernetes.cri.sandbox-name") or annotations.get(
        "io.kubernetes.pod.name", ""
    )
    return namespace, pod


def requested_limits(annotations: Mapping[str, str]) -> Request | None:
    """Return this container's limits, or None when it has none (or is a pod sandbox)."""
    if any(annotations.get(key) == value for key, value in SANDBOX_MARKERS):
        return None
    raw = annotations.get(LIMITS_ANNOTATION)
    if raw is None:
        return None
    name = container_name(annotations)
    if not name:
        raise HookError(
            f"the spec carries {LIMITS_ANNOTATION} but no container name "
            f"({' or '.join(NAME_ANNOTATIONS)})",
            "run limited containers through Kubernetes (containerd or CRI-O)",
        )
    try:
        table = limits_table(raw)
        found = entry_limits(table, name)
        if found is None:
            return None
        gpus = entry_gpus(table, name)
        virtual = entry_virtual(table, name)
    except ContractError as exc:
        raise HookError(str(exc), _FIX_ANNOTATION) from None
    cores, memory = found
    return Request(container=name, cores=cores, memory=memory, gpus=gpus, virtual=virtual)


def too_few_gpus(request: Request, devices: tuple[str, ...]) -> str | None:
    """Why ``devices`` cannot carry a share of ``request.gpus`` distinct GPUs, or None.

    A device plugin that hands out time-slicing replicas (NVIDIA's ``nvidia.com/gpu.shared``)
    may give two replicas of one GPU: the list then names fewer distinct GPUs than asked for.
    """
    if request.gpus == 1 or len(devices) == request.gpus:
        return None
    shown = ", ".join(devices) or "none"
    return (
        f"the container asks for shares of {request.gpus} distinct GPUs, but the device "
        f"side gave it {len(devices)} ({shown})"
    )




def overcommit(
    request: Request,
    devices: Iterable[str],
    committed: Mapping[str, tuple[int, int]],
    inventory: Mapping[str, Gpu],
    sharing: Sharing,
    sharers: Mapping[str, int] | None = None,
) -> str | None:
    """Return why ``request`` more on each of ``devices`` does not fit, or None when it fits.

    ``committed`` is the (memory, cores) already promised per GPU UUID, ``sharers`` the
    shared containers already on each; a GPU may give out its total memory times the
    memory scaling, its time times the cores scaling, and room for at most ``max_sharers``
    containers (0: no cap). Every device must be in ``inventory`` (the caller has made sure).
    """
    cores_capacity = sharing.cores()
    for uuid in devices:
        gpu = inventory[uuid]
        memory, cores = committed.get(uuid, (0, 0))
        capacity = sharing.memory(gpu.memory)
        free = max(capacity - memory, 0)
        if request.memory > free:
            return (
                f"GPU {uuid} (index {gpu.index}) has {_gib(free)} free of {_gib(capacity)} "
                f"for shared containers, and this container asks for {_gib(request.memory)}"
            )
        if request.cores > cores_capacity - cores:
            return (
                f"GPU {uuid} (index {gpu.index}) has {max(cores_capacity - cores, 0)}% of its "
                f"time free for shared containers, and this container asks for {request.cores}%"
            )
        present = (sharers or {}).get(uuid, 0)
        if sharing.max_sharers and present >= sharing.max_sharers:
            return (
                f"GPU {uuid} (index {gpu.index}) has {present} shared "
                f"container{'s' if present != 1 else ''}, the most "
                f"this node allows on one GPU (--max-sharers {sharing.max_sharers})"
            )
    return None


def _gib(size: int) -> str:
    return f"{size / _GIB:.2f} GiB ({size} bytes)"
