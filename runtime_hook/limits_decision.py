"""Pure decisions of the hook: whose limits apply, on which GPUs, and whether they fit.

No I/O here: the stages feed in annotations, the environment and the node's
records, and act on what comes back.
"""

from __future__ import annotations

# collections.abc re-exports these from _collections_abc, which os has loaded
# already; importing collections.abc would load all of collections (2 ms).
from _collections_abc import Iterable, Mapping

from runtime_hook.contract import LIMITS_ANNOTATION, ContractError, Gpu, container_limits
from runtime_hook.hook_errors import HookError
from runtime_hook.record import Record

# containerd's key first, then CRI-O's.
NAME_ANNOTATIONS = ("io.kubernetes.cri.container-name", "io.kubernetes.container.name")
SANDBOX_MARKERS = (
    ("io.kubernetes.cri.container-type", "sandbox"),
    ("io.kubernetes.cri-o.ContainerType", "sandbox"),
)
# Where NVIDIA's device plugin puts device IDs in its volume-mounts strategy.
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"

_FIX_ANNOTATION = "let the vcuda webhook write vcuda.io/limits (never edit it by hand)"
_GIB = 1 << 30


class Request(Record):
    """The limits one container asked for: its name, percent of GPU time, bytes of memory."""

    _fields = ("container", "cores", "memory")
    __slots__ = _fields


class Devices(Record):
    """The GPUs a container sees, as tuples of UUIDs.

    ``for_limits`` goes into the limits file (empty: every GPU it sees);
    ``for_ledger`` is what its memory is committed on; ``notes`` are warnings to log.
    """

    _fields = ("for_limits", "for_ledger", "notes")
    __slots__ = _fields
    _defaults = ((),)


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
        found = container_limits(raw, name)
    except ContractError as exc:
        raise HookError(str(exc), _FIX_ANNOTATION) from None
    if found is None:
        return None
    cores, memory = found
    return Request(container=name, cores=cores, memory=memory)


def visible_devices(
    env: Iterable[str], mount_targets: Iterable[str], inventory: Mapping[str, Gpu] | None
) -> Devices:
    """Read the GPUs of ``NVIDIA_VISIBLE_DEVICES`` (the last one wins, as NVIDIA's hook reads it).

    The value may hold UUIDs, indices, ``all``, ``none``/``void``, or the
    volume-mounts directory, whose IDs are then the names of the spec's mounts in it.
    """
    value = None
    for item in env:
        key, _, val = item.partition("=")
        if key == "NVIDIA_VISIBLE_DEVICES":
            value = val.strip()
    if value in (None, "", "none", "void"):
        return Devices((), (), ("NVIDIA_VISIBLE_DEVICES names no GPU: no memory is committed",))
    if value == "all":
        every = tuple(sorted(inventory)) if inventory else ()
        return Devices((), every)
    if value.rstrip("/") == DEVICE_LIST_DIR:
        prefix = DEVICE_LIST_DIR + "/"
        ids = [t[len(prefix) :] for t in mount_targets if t.startswith(prefix)]
    else:
        ids = [part.strip() for part in value.split(",") if part.strip()]
    uuids: list[str] = []
    notes: list[str] = []
    by_index = {g.index: g.uuid for g in (inventory or {}).values()}
    for device in ids:
        if any(c in device for c in ",=#\n\r\t "):
            raise HookError(
                f"NVIDIA_VISIBLE_DEVICES holds {device!r}, with a character no device ID has",
                "check the device plugin's configuration",
            )
        if device.startswith(("GPU-", "MIG-")):
            uuids.append(device)
        elif device.isdigit() and inventory is None:
            notes.append(f"GPU index {device} cannot be mapped to a UUID without the inventory")
        elif device.isdigit() and int(device) in by_index:
            uuids.append(by_index[int(device)])
        elif device.isdigit():
            raise HookError(
                f"NVIDIA_VISIBLE_DEVICES names GPU index {device}, which the node's GPU "
                "inventory does not list",
                "check that the node agent runs and sees every GPU",
            )
        else:
            raise HookError(
                f"NVIDIA_VISIBLE_DEVICES holds {device!r}, neither a GPU UUID nor an index",
                "use NVIDIA's device plugin with deviceIDStrategy uuid or index",
            )
    found = tuple(dict.fromkeys(uuids))
    unlisted = [uuid for uuid in found if inventory is not None and uuid not in inventory]
    if unlisted:
        notes.append(f"{', '.join(unlisted)} not in the GPU inventory: memory there is not checked")
    # With an index left unmapped the file cannot list every GPU: let it mean "all visible".
    unmapped = inventory is None and any(d.isdigit() for d in ids)
    return Devices(() if unmapped else found, found, tuple(notes))


def overcommit(
    memory: int,
    devices: Iterable[str],
    committed: Mapping[str, int],
    inventory: Mapping[str, Gpu],
    scaling: float,
) -> str | None:
    """Return why ``memory`` more on each of ``devices`` does not fit, or None when it fits.

    ``committed`` is the memory already promised per GPU UUID; a GPU may give
    out its total memory times ``scaling``. GPUs missing from the inventory are
    not checked.
    """
    for uuid in devices:
        gpu = inventory.get(uuid)
        if gpu is None:
            continue
        capacity = int(gpu.memory * scaling)
        free = max(capacity - committed.get(uuid, 0), 0)
        if memory > free:
            return (
                f"GPU {uuid} (index {gpu.index}) has {_gib(free)} free of {_gib(capacity)} "
                f"for shared containers, and this container asks for {_gib(memory)}"
            )
    return None


def _gib(size: int) -> str:
    return f"{size / _GIB:.2f} GiB ({size} bytes)"
