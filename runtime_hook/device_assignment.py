"""Which GPUs the device side gave a container: the only source of the devices its limits apply to.

The container's environment, image and pod spec are the tenant's: a pod may
set ``NVIDIA_VISIBLE_DEVICES`` itself, and kubelet puts its own ``env`` after
the device plugin's. So the GPUs come only from a *trusted source*, something
written by the device side that a pod without host privileges cannot forge:

- NVIDIA's device plugin with ``deviceListStrategy: volume-mounts``: one bind
  mount of ``/dev/null`` at ``/var/run/nvidia-container-devices/<id>`` per
  GPU. A pod can only make such a mount with a ``hostPath`` volume, which the
  namespaces of tenants must forbid (Pod Security ``baseline`` does). vcuda's
  own device plugin gives GPUs the same way (through a CDI spec).
- vcuda's placement: the shared GPU(s) that the scheduler extender chose at bind (a container
  with shares of N GPUs takes the first N of its pod's ``shared`` and ``also_shared``),
  in the pod's ``vcuda.io/assigned-gpus`` (containerd passes ``vcuda.io/*`` pod
  annotations into the spec). Only the extender writes it, through the pod's
  Binding; the webhook removes it from new pods and refuses updates that touch it.

Each source is a function of the container that returns the device IDs it
recorded, or None when it has no say for this container; :data:`SOURCES`
lists them, and placement's record of the GPU chosen at bind goes first when
it exists. Sources that speak must agree. The environment is then only
checked: when it names GPUs (``NVIDIA_VISIBLE_DEVICES``, any occurrence) other
than the trusted ones, the start is refused. UUIDs compare as NVIDIA's tools
compare them, without regard to case; ``MIG-`` UUIDs are accepted.
"""

from __future__ import annotations

# collections.abc re-exports these from _collections_abc, which os has loaded
# already; importing collections.abc would load all of collections (2 ms).
from _collections_abc import Callable, Iterable, Mapping

from runtime_hook import fast_json
from runtime_hook.contract import ASSIGNMENT_ANNOTATION, Gpu, is_mig
from runtime_hook.hook_errors import HookError
from runtime_hook.limits_decision import requested_limits
from runtime_hook.oci_spec import Container
from runtime_hook.record import Record

DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
DEVICE_LIST_SOURCE = "/dev/null"
ENV_NAME = "NVIDIA_VISIBLE_DEVICES"
_NOT_DEVICES = ("", "void", "none", DEVICE_LIST_DIR, DEVICE_LIST_DIR + "/")
_FIX_PLUGIN = (
    "run NVIDIA's device plugin with deviceListStrategy volume-mounts "
    "(manifests/device-plugin/config.yaml)"
)
_FIX_ENV = "remove NVIDIA_VISIBLE_DEVICES from the pod's env: the device plugin chooses the GPUs"
_FIX_INVENTORY = "restart the node agent so that its GPU inventory lists every GPU of this node"
_FIX_PLACEMENT = "delete the pod so that vcuda's scheduler places it again"


class Source(Record):
    """A trusted source: its name, for messages, and ``read(container)`` -> IDs or None."""

    _fields = ("name", "read")
    __slots__ = _fields
    name: str
    read: Callable[[Container], tuple[str, ...] | None]


class Devices(Record):
    """The GPUs a container was given, as tuples of UUIDs.

    ``for_limits`` goes into the limits file (empty: every GPU it sees);
    ``for_ledger`` is what its memory and cores are committed on; ``notes`` are warnings to log.
    """

    _fields = ("for_limits", "for_ledger", "notes")
    __slots__ = _fields
    _defaults = ((),)
    for_limits: tuple[str, ...]
    for_ledger: tuple[str, ...]
    notes: tuple[str, ...]


def from_volume_mounts(container: Container) -> tuple[str, ...] | None:
    """The IDs of NVIDIA's volume-mounts device list, or None when the spec has none."""
    prefix = DEVICE_LIST_DIR + "/"
    ids = tuple(
        destination[len(prefix) :]
        for destination, source, is_bind in container.mounts
        if destination.startswith(prefix)
        and "/" not in destination[len(prefix) :]  # imex/<channel> are not GPUs
        and source == DEVICE_LIST_SOURCE
        and is_bind
    )
    return ids or None


def from_assignment(container: Container) -> tuple[str, ...] | None:
    """The shared GPUs vcuda's scheduler bound the pod to for this container, or None when it
    did not place it."""
    raw = container.annotations.get(ASSIGNMENT_ANNOTATION)
    if raw is None:
        return None
    try:
        body = fast_json.loads(raw)
        shared = body.get("shared") if isinstance(body, dict) else None
        also = body.get("also_shared", []) if isinstance(body, dict) else []
    except ValueError:
        shared, also = None, []
    if not (isinstance(shared, list) and shared and isinstance(shared[0], str) and shared[0]):
        raise HookError(f"annotation {ASSIGNMENT_ANNOTATION} ({raw[:200]}) names no shared GPU "
                        "for this limited container", _FIX_PLACEMENT)
    request = requested_limits(container.annotations)
    count = request.gpus if request is not None else 1
    gpus = [shared[0], *also] if isinstance(also, list) else []
    if len(gpus) < count or not all(isinstance(gpu, str) and gpu for gpu in gpus):
        raise HookError(f"annotation {ASSIGNMENT_ANNOTATION} ({raw[:200]}) names fewer than the "
                        f"{count} shared GPUs this container asks for", _FIX_PLACEMENT)
    return tuple(gpus[:count])


def device_plugin_spec(gpus: Iterable[str]) -> tuple[list[str], list[dict]]:
    """The (env, mounts) NVIDIA's device plugin puts in a spec for ``gpus`` (volume-mounts).

    What the demo and the tests build bundles with; the hook reads only the mounts.
    """
    mounts = [
        {
            "destination": f"{DEVICE_LIST_DIR}/{gpu}",
            "type": "bind",
            "source": DEVICE_LIST_SOURCE,
            "options": ["rbind", "rprivate", "ro"],
        }
        for gpu in gpus
    ]
    return ([f"{ENV_NAME}={DEVICE_LIST_DIR}"] if mounts else []), mounts


SOURCES: tuple[Source, ...] = (
    Source("vcuda's placement at bind", from_assignment),
    Source("the device plugin's volume mounts", from_volume_mounts),
)


def assigned(
    container: Container,
    inventory: Mapping[str, Gpu] | None,
    sources: tuple[Source, ...] = SOURCES,
) -> Devices:
    """Return the GPUs the device side gave ``container``; raise HookError when it cannot tell.

    ``inventory`` (by UUID, None when the node has none) maps indices to UUIDs
    and gives each UUID its spelling; a GPU missing from it is refused, since
    its memory and time could not be checked.
    """
    spoken = [(source.name, ids) for source in sources if (ids := source.read(container))]
    if not spoken:
        names = " or ".join(source.name for source in sources)
        raise HookError(f"no trusted list of this container's GPUs ({names})", _FIX_PLUGIN)
    by_key = {uuid.lower(): gpu for uuid, gpu in (inventory or {}).items()}
    resolved = [(name, _uuids(ids, by_key, inventory is None, name)) for name, ids in spoken]
    first_name, first = resolved[0]
    for name, uuids in resolved[1:]:
        if _keys(uuids) != _keys(first):
            raise HookError(
                f"{first_name} give this container {_shown(first)} but {name} give "
                f"{_shown(uuids)}",
                "check that the device plugin and vcuda's placement agree on this node",
            )
    _check_environment(container.env, first, by_key, first_name)
    if inventory is None:
        notes = (f"no GPU inventory: memory and time on {_shown(first)} are not checked",)
        unmapped = any(u.isdigit() for u in first)  # an index cannot be named in the file
        return Devices(() if unmapped else first, first, notes)
    return Devices(first, first)


def _uuids(
    ids: Iterable[str], by_key: Mapping[str, Gpu], no_inventory: bool, source: str
) -> tuple[str, ...]:
    """UUIDs (the inventory's spelling) of ``ids``; indices only when there is no inventory."""
    by_index = _by_index(by_key)
    found: list[str] = []
    for device in ids:
        device = device.strip()
        if not device or any(c in device for c in ",=#\n\r\t \0"):
            raise HookError(f"{source} hold {device!r}, which is no device ID", _FIX_PLUGIN)
        if device.isdigit():
            if no_inventory:
                found.append(device)
            elif device in by_index:
                found.append(by_index[device])
            else:
                raise HookError(
                    f"{source} name GPU index {device}, which this node's GPU inventory "
                    "does not list",
                    _FIX_INVENTORY,
                )
        elif device[:4].upper() in ("GPU-", "MIG-"):
            gpu = by_key.get(device.lower())
            if gpu is None and not no_inventory:
                raise HookError(
                    f"{source} name {device}, which this node's GPU inventory does not list: "
                    "its memory and time cannot be checked",
                    _FIX_INVENTORY,
                )
            found.append(gpu.uuid if gpu else device)
        else:
            raise HookError(
                f"{source} hold {device!r}, neither a GPU UUID nor an index",
                "use NVIDIA's device plugin with deviceIDStrategy uuid or index",
            )
    return tuple(dict.fromkeys(found))


def _check_environment(
    env: Iterable[str], trusted: tuple[str, ...], by_key: Mapping[str, Gpu], source: str
) -> None:
    """Refuse when ``NVIDIA_VISIBLE_DEVICES`` names GPUs other than ``trusted``."""
    want = _keys(trusted)
    by_index = {index: uuid.lower() for index, uuid in _by_index(by_key).items()}
    for item in env:
        key, _, value = item.partition("=")
        if key != ENV_NAME or value.strip() in _NOT_DEVICES:
            continue
        value = value.strip()
        if value == "all":
            named = set(by_key) if by_key else {"all"}
        else:
            named = {by_index.get(part.strip(), part.strip().lower()) for part in value.split(",")}
            named.discard("")
        if named != want:
            raise HookError(
                f"the container's environment sets {ENV_NAME}={value[:200]}, but {source} "
                f"give it {_shown(trusted)}",
                _FIX_ENV,
            )


def _by_index(by_key: Mapping[str, Gpu]) -> dict[str, str]:
    """The inventory's whole GPUs by index (a MIG device shares its GPU's index)."""
    return {str(gpu.index): gpu.uuid for gpu in by_key.values() if not is_mig(gpu.uuid)}


def _keys(uuids: Iterable[str]) -> set[str]:
    return {uuid.lower() for uuid in uuids}


def _shown(uuids: Iterable[str]) -> str:
    return ",".join(uuids) or "no GPU"

