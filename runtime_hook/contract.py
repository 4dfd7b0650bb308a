"""The contract: every name, number and format that two vcuda components share.

The webhook writes what the hook reads, the node agent writes what the hook
reads, and the hook and ``vcuda-run`` write what ``libvcuda.so`` reads. Each of
those names and formats is defined here, once; the webhook, the hook, the node
agent and the demo import it and define no copy of their own. Standard library
only and cheap to import: the OCI hook loads it on every limited container
start, so nothing here imports ``json``, ``re``, ``typing`` or ``collections``
at module level.

- The release, :data:`VERSION`, which every component reports.
- Resources: ``<domain>/vcuda-core`` (percent of one GPU; 1..99 shares one GPU,
  100·k is k whole GPUs) and ``<domain>/vcuda-memory`` (units of 256 MiB). With
  ``<domain>/vcuda-gpus: N`` (1..``MAX_SHARED_GPUS``) beside a share, the container
  has a share of each of N distinct GPUs, and vcuda-core and vcuda-memory are what
  it has on **each** of them; without it (or with 1) the meaning is the one above.
- The limits annotation ``vcuda.io/limits`` (webhook → hook), on the pod::

      {"<container>": {"cores": 1..99, "memory": <bytes, at least 1>,
                       "gpus": 2..16}, ...}

  JSON object, one entry per shared-mode container; ``cores`` and ``memory`` are
  per GPU; ``gpus`` is written only above 1 (an entry without it, as every entry
  before vcuda-gpus, is one GPU); nothing else in an entry is read.
- The limits file (hook, ``vcuda-run`` → ``libvcuda.so``): ``key=value`` lines,
  see :func:`render_limits`; the C parser in ``cshim/`` reads the same lines.
- The GPU inventory (node agent → hook), JSON::

      {"version": 1, "gpus": [{"uuid": "GPU-5c3d...", "index": 0, "memory": <bytes>}, ...]}

  A GPU in MIG mode is listed with its MIG devices (``MIG-...``), each with
  its own memory and its GPU's index; an index names the whole GPU.

- ``vcuda-run``'s private directory (``vcuda-run`` → node agent):
  ``$TMPDIR/vcuda-run-*/`` holding ``owner`` and ``limits``.
- RFC 6901 escaping of resource and annotation names in JSON Patch paths.
- Log lines (webhook, extender, node agent): one JSON object a line whose
  ``time``, ``level`` and ``event`` :func:`log_line` writes, the same in each.
- The largest share a node's GPUs give (node agent → webhook): the Node
  annotation ``vcuda.io/max-gpu-memory``, the bytes of its largest GPU times the
  agent's memory scaling, in decimal (plain ASCII digits, 256 MiB to
  ``MAX_GPU_MEMORY``); the webhook reads it of the Nodes labelled
  ``vcuda.io/enabled=true``.
- Per-GPU placement (node agent, scheduler extender, device plugin, hook): the
  Node annotations ``vcuda.io/gpus`` (inventory and heartbeat) and
  ``vcuda.io/gpu-ledger``, the Pod annotation ``vcuda.io/assigned-gpus``, and the
  device-plugin resources ``vcuda.io/shared-gpu`` and ``vcuda.io/gpu``; their
  formats, and the bounds their readers hold them to (characters, GPUs, numbers),
  are in :mod:`runtime_hook.placement`.
"""

from __future__ import annotations

import os

# Defined beside the hook's errors so that poststop, which reads no contract, can raise them.
from runtime_hook.hook_errors import VcudaError

# Every component's log lines (field names, time format); beside the hook's log for poststop.
from runtime_hook.hook_log import EVENT_FIELD as EVENT_FIELD
from runtime_hook.hook_log import log_line as log_line

# Every component's way to its Kubernetes credentials (kubernetes is imported only when used).
from runtime_hook.kube_credentials import CredentialsError as CredentialsError
from runtime_hook.kube_credentials import api_client as api_client
from runtime_hook.kube_credentials import in_cluster as in_cluster
from runtime_hook.record import Record

TYPE_CHECKING = False  # typing's, without importing typing (the hook's start-up cost)
if TYPE_CHECKING:
    from argparse import ArgumentParser
    from collections.abc import Callable, Mapping


# The release, in one place: setup.cfg's metadata takes it from here (``attr:``), and every
# ``--version`` and the ``vcuda_build_info`` metric print it, the hook's copy on a node too,
# which has no package metadata to read.
VERSION = "0.2.0"


class ContractError(VcudaError, ValueError):
    """A value breaks the contract; the message says which value and what is allowed."""


# Resources and their units.
DEFAULT_DOMAINS = ("docker.com", "tencent.com")
CORE_RESOURCE = "vcuda-core"
MEMORY_RESOURCE = "vcuda-memory"
GPUS_RESOURCE = "vcuda-gpus"  # shares of how many distinct GPUs (per-GPU core and memory)
# The limits file lists at most 16 devices (cshim/src/limits_file.h, VC_MAX_DEVICES).
MAX_SHARED_GPUS = 16
CORES_PER_GPU = 100  # vcuda-core of one whole GPU
SHARE_MIN, SHARE_MAX = 1, 99  # vcuda-core of a shared GPU
SHARES = f"{SHARE_MIN}..{SHARE_MAX}"  # the range as messages write it
MEMORY_UNIT = 256 << 20  # bytes in one vcuda-memory unit
MEMORY_SCALING_MAX = 100.0  # --memory-scaling of the hook and the node agent is in (0, 100]
CORES_SCALING_MAX = 10.0  # --cores-scaling is in [1, 10]: shares of one GPU add up to 1000% at most
MAX_SHARERS = 1000  # --max-sharers is in 0..1000 (0: no cap)
# 1 PiB: more than any GPU has, scaled; a larger figure that a node or pod publishes is malformed.
MAX_GPU_MEMORY = 1 << 50

_DNS_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


def resource_names(domain: str) -> tuple[str, str]:
    """The (vcuda-core, vcuda-memory) resource names of ``domain``."""
    return f"{domain}/{CORE_RESOURCE}", f"{domain}/{MEMORY_RESOURCE}"


def gpus_resource(domain: str) -> str:
    """The vcuda-gpus resource name of ``domain``."""
    return f"{domain}/{GPUS_RESOURCE}"


def is_dns_subdomain(name: str) -> bool:
    """Whether ``name`` is lower-case DNS labels joined by dots, as a domain or a RuntimeClass."""
    return bool(name) and all(
        label and set(label) <= _DNS_LABEL_CHARS and label[0] != "-" and label[-1] != "-"
        for label in name.split(".")
    )


def check_domains(domains: tuple[str, ...]) -> tuple[str, ...]:
    """Return ``domains`` when each is a usable resource domain, once; else raise ContractError."""
    if not domains:
        raise ContractError("give at least one resource domain")
    for domain in domains:
        if not is_dns_subdomain(domain):
            raise ContractError(f"{domain!r} is not a DNS name like 'docker.com'")
    if len(set(domains)) != len(domains):
        raise ContractError("a domain is listed twice")
    return domains


def memory_scaling(text: str) -> float:
    """Parse a ``--memory-scaling`` value: the share of each GPU's memory given out, (0, 100]."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= MEMORY_SCALING_MAX:
        raise ContractError(f"{text!r} is not a number in (0, {MEMORY_SCALING_MAX:g}], e.g. 1.5")
    return value


def cores_scaling(text: str) -> float:
    """Parse a ``--cores-scaling`` value: how far the shares of one GPU's time may add up past
    100 percent, [1, 10]."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 1 <= value <= CORES_SCALING_MAX:
        raise ContractError(f"{text!r} is not a number in [1, {CORES_SCALING_MAX:g}], e.g. 1.5")
    return value


def max_sharers(text: str) -> int:
    """Parse a ``--max-sharers`` value: the most shared containers on one GPU, 0 for no cap."""
    if not (text.isascii() and text.isdigit() and int(text) <= MAX_SHARERS):
        raise ContractError(f"{text!r} is not a whole number in 0..{MAX_SHARERS} "
                            "(0: no cap), e.g. 10")
    return int(text)


class Sharing(Record):
    """A node's settings for shared GPUs, the same in the hook and the node agent.

    ``memory_scaling``: each GPU's memory given out is its total times this; ``cores_scaling``:
    the shares of one GPU's time may add up to 100 percent times this; ``max_sharers``: the
    most shared containers (or DRA claims) on one GPU, 0 for no cap.
    """

    _fields = ("memory_scaling", "cores_scaling", "max_sharers")
    __slots__ = _fields
    _defaults = (1.0, 1.0, 0)
    memory_scaling: float
    cores_scaling: float
    max_sharers: int

    def memory(self, total: int) -> int:
        """Bytes a GPU of ``total`` bytes gives out to shared containers."""
        return int(total * self.memory_scaling)

    def virtual_memory(self, memory: int) -> int:
        """Of a limit of ``memory`` bytes, those that may live in host memory when the
        container asks for virtual memory: all but ``memory`` divided by the scaling, which
        the GPUs' shares of device memory add up to at most."""
        if self.memory_scaling <= 1:
            return 0
        return memory - max(1, int(memory / self.memory_scaling))

    def cores(self) -> int:
        """Percent of one GPU's time that its shares may add up to."""
        return round(CORES_PER_GPU * self.cores_scaling)

    def flags(self) -> list[str]:
        """The command-line flags (of the hook, of ``vcuda-node run``) that differ from the
        defaults."""
        found = []
        for flag, value, default in (
            ("--memory-scaling", self.memory_scaling, 1.0),
            ("--cores-scaling", self.cores_scaling, 1.0),
            ("--max-sharers", self.max_sharers, 0),
        ):
            if value != default:
                found += [flag, f"{value:g}"]
        return found


def number_flag(
    unit: str = "", low: float = 0.0, low_allowed: bool = False
) -> Callable[[str], float]:
    """An argparse type for a number of ``unit`` above ``low`` (or from it, ``low_allowed``).

    Finite only: NaN or inf seconds would spin a loop or never wake it. Every
    command and script of vcuda parses its durations and rates with one of these.
    """
    bound = f", at least {low:g}" if low_allowed else f" more than {low:g}"
    wanted = f"a number of {unit}{bound}" if unit else f"a number{bound}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (low <= value if low_allowed else low < value) or value == float("inf"):
            import argparse  # only to refuse: the hook reads this module and has no argparse

            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        return value

    parse.__name__ = wanted  # what argparse names the type in its other messages
    return parse


positive_seconds = number_flag("seconds")


def version_flag(parser: ArgumentParser) -> None:
    """Give ``parser`` the ``--version`` of every vcuda command: it prints ``<prog> VERSION``."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}",
                        help="print vcuda's version and exit")


def count_flag(text: str) -> int:
    """An argparse type for a count (connections, MiB, runs): a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        import argparse  # only to refuse, as above

        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number, at least 1")
    return value


def core_limits_flag(text: str) -> list[int]:
    """An argparse type for the benchmarks' --cores: comma-separated shares of a GPU, each a
    whole number in SHARE_MIN..SHARE_MAX."""
    try:
        limits = [int(word) for word in text.split(",")]
    except ValueError:
        limits = []
    if not limits or not all(SHARE_MIN <= n <= SHARE_MAX for n in limits):
        import argparse  # only to refuse, as above

        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of core limits from {SHARE_MIN} to {SHARE_MAX}, e.g. 30,60")
    return limits


def pointer_token(name: str) -> str:
    """``name`` as one JSON Pointer token (RFC 6901): ``nvidia.com/gpu`` -> ``nvidia.com~1gpu``."""
    return name.replace("~", "~0").replace("/", "~1")


# The limits annotation.
ANNOTATION_DOMAIN = "vcuda.io"  # every vcuda annotation is under it
LIMITS_ANNOTATION = f"{ANNOTATION_DOMAIN}/limits"

# Per-GPU placement (formats and their readers and writers: runtime_hook.placement).
INVENTORY_ANNOTATION = f"{ANNOTATION_DOMAIN}/gpus"  # Node: the agent's GPUs and heartbeat
LEDGER_ANNOTATION = f"{ANNOTATION_DOMAIN}/gpu-ledger"  # Node: what each GPU has given out
ASSIGNMENT_ANNOTATION = f"{ANNOTATION_DOMAIN}/assigned-gpus"  # Pod: its GPUs, set at bind
# Node: the most memory one share may have there (bytes of its largest GPU times the scaling).
MAX_GPU_MEMORY_ANNOTATION = f"{ANNOTATION_DOMAIN}/max-gpu-memory"
# Pod: "true" asks for virtual device memory where the node scales memory (docs/LIBVCUDA.md).
VIRTUAL_MEMORY_ANNOTATION = f"{ANNOTATION_DOMAIN}/virtual-memory"
ENABLED_LABEL = f"{ANNOTATION_DOMAIN}/enabled"  # Node: "true" where vcuda's DaemonSet runs
SHARED_RESOURCE = f"{ANNOTATION_DOMAIN}/shared-gpu"  # vcuda's device plugin: one a share
WHOLE_RESOURCE = f"{ANNOTATION_DOMAIN}/gpu"  # vcuda's device plugin: one a whole GPU
# NVIDIA's device plugin with time-slicing and renameByDefault: one a share (the default path).
NVIDIA_SHARED_RESOURCE = "nvidia.com/gpu.shared"


def render_limits_annotation(limits: dict[str, dict[str, int]]) -> str:
    """The annotation's value for ``{container: {"cores": c, "memory": bytes}}``, keys sorted."""
    # The webhook and the demo render, once a review (msgspec: a twelfth of json's cost);
    # the hook only reads.
    import msgspec

    return msgspec.json.encode(limits, order="sorted").decode()


def container_limits(value: str, container: str) -> tuple[int, int] | None:
    """``container``'s (cores, memory) in the annotation's ``value``; None without an entry.

    Raise ContractError when the value, or the container's entry, breaks the format.
    """
    return entry_limits(limits_table(value), container)


def limits_table(value: str) -> dict:
    """The annotation's ``value`` decoded, entries by container; ContractError if not an object.

    Entries are checked one by one, by :func:`entry_limits`, when a container's is read.
    """
    from runtime_hook import fast_json  # prestart has it already; poststop never reads JSON

    try:
        table = fast_json.loads(value)
    except ValueError as exc:
        raise ContractError(f"annotation {LIMITS_ANNOTATION} is not JSON ({exc})") from None
    if not isinstance(table, dict):
        raise ContractError(f"annotation {LIMITS_ANNOTATION} is not a JSON object")
    return table


def entry_limits(table: Mapping, container: str) -> tuple[int, int] | None:
    """``container``'s (cores, memory) in a decoded annotation; None without an entry.

    Raise ContractError when the entry breaks the format.
    """
    entry = table.get(container)
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ContractError(
            f"annotation {LIMITS_ANNOTATION}: entry for {container!r} is not an object"
        )
    cores = _whole_number(entry, "cores", container, SHARE_MIN, SHARE_MAX)
    memory = _whole_number(entry, "memory", container, 1, None)
    return cores, memory


def entry_gpus(table: Mapping, container: str) -> int:
    """How many distinct GPUs ``container``'s entry shares: its ``gpus``, 1 where absent.

    Call after :func:`entry_limits` found the entry; raise ContractError when ``gpus``
    is not a whole number 1..MAX_SHARED_GPUS.
    """
    entry = table[container]
    if "gpus" not in entry:
        return 1
    return _whole_number(entry, "gpus", container, 1, MAX_SHARED_GPUS)


def entry_virtual(table: Mapping, container: str) -> bool:
    """Whether ``container``'s entry asks for virtual device memory (``"virtual": true``).

    Call after :func:`entry_limits` found the entry; raise ContractError when ``virtual`` is
    not a boolean.
    """
    value = table[container].get("virtual", False)
    if type(value) is not bool:
        raise ContractError(f"annotation {LIMITS_ANNOTATION}: virtual of {container!r} is "
                            f"{value!r}, expected true or false")
    return value


def _whole_number(entry: dict, key: str, container: str, low: int, high: int | None) -> int:
    value = entry.get(key)
    if type(value) is int and value >= low and (high is None or value <= high):  # not a bool
        return value
    span = f"{low}..{high}" if high is not None else f"at least {low}"
    raise ContractError(
        f"annotation {LIMITS_ANNOTATION}: {key} of {container!r} is {value!r}, "
        f"expected a whole number {span}"
    )


# The limits file. UTF-8, one ``key=value`` per line, no spaces around ``=``,
# lines starting with ``#`` ignored, unknown keys ignored by the shim (forward
# compatible), each key at most once:
#
#     version=1
#     memory=10737418240          bytes allowed on each listed device
#     cores=30                    percent of each device's time, 1..100
#     devices=GPU-5c3d...,GPU-... UUIDs the limits apply to (empty: all visible)
#     account=/run/vcuda/account  shared account file of all processes
#     virtual-memory=5368709120   of memory, bytes that may live in host memory (0 when absent)
LIMITS_VERSION = 1
LIMITS_PATH = "/etc/vcuda/limits"  # inside a container; it wins over the environment
# A limited container's account, shared by its processes: the hook mounts the
# directory, the shim creates the file, the node agent reads it from the host.
ACCOUNT_MOUNT = "/run/vcuda"
ACCOUNT_PATH = f"{ACCOUNT_MOUNT}/account"
LIMITS_MAX_LINE = 4096


class LimitsFormatError(ContractError):
    """The text is not a valid limits file; the message says which line and why."""

    fix = "write limits the shim accepts (cshim/README.md lists them)"


# A Record, not a dataclass or a named tuple: importing dataclasses (9 ms) or
# collections (2 ms) would cost the hook that much on every limited container start.
class Limits(Record):
    """What one container (or one `vcuda-run` command) may use on each device.

    ``memory`` in bytes, ``cores`` in percent, ``devices`` GPU UUIDs, ``account`` a path;
    ``virtual_memory``: the bytes of ``memory`` that may live in host memory once the rest is
    taken on the device (docs/LIBVCUDA.md, "Virtual device memory").
    """

    _fields = ("memory", "cores", "devices", "account", "virtual_memory")
    __slots__ = _fields
    memory: int
    cores: int
    devices: tuple[str, ...]
    account: str
    virtual_memory: int

    def __init__(
        self, memory: int, cores: int = 100, devices: tuple[str, ...] = (), account: str = "",
        virtual_memory: int = 0,
    ) -> None:
        super().__init__(memory, cores, tuple(devices), account, virtual_memory)
        self._check()

    def _check(self) -> None:
        if self.memory <= 0:
            raise LimitsFormatError(f"memory must be a positive number of bytes, got {self.memory}")
        if not 0 <= self.virtual_memory < self.memory:
            raise LimitsFormatError(f"virtual-memory must be less than memory ({self.memory}), "
                                    f"got {self.virtual_memory}")
        if not 1 <= self.cores <= CORES_PER_GPU:
            raise LimitsFormatError(f"cores must be 1..{CORES_PER_GPU}, got {self.cores}")
        for uuid in self.devices:
            if not uuid or any(c in uuid for c in ",=\n\r\t #"):
                raise LimitsFormatError(f"device UUID {uuid!r} holds a character not allowed")
        if any(c in self.account for c in "\n\r\0"):
            raise LimitsFormatError("account path holds a line break or NUL")


def render_limits(limits: Limits) -> str:
    """Return the limits file's text for ``limits``."""
    lines = [
        f"version={LIMITS_VERSION}",
        f"memory={limits.memory}",
        f"cores={limits.cores}",
        f"devices={','.join(limits.devices)}",
    ]
    if limits.account:
        lines.append(f"account={limits.account}")
    if limits.virtual_memory:
        lines.append(f"virtual-memory={limits.virtual_memory}")
    return "\n".join(lines) + "\n"


def parse_limits(text: str) -> Limits:
    """Parse a limits file as the shim does; raise LimitsFormatError on anything it would reject."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        if len(line) > LIMITS_MAX_LINE or "=" not in line:
            raise LimitsFormatError(f"line {number}: expected key=value")
        key, value = line.split("=", 1)
        if key in values:
            raise LimitsFormatError(f"line {number}: {key} given twice")
        values[key] = value
    if values.get("version") != str(LIMITS_VERSION):
        raise LimitsFormatError(f"version must be {LIMITS_VERSION}")
    try:
        memory = int(values["memory"])
        cores = int(values.get("cores", str(CORES_PER_GPU)))
    except KeyError as exc:
        raise LimitsFormatError(f"{exc.args[0]} is missing") from None
    except ValueError:
        raise LimitsFormatError("memory and cores must be whole numbers") from None
    virtual = values.get("virtual-memory", "0")
    if not virtual.isdigit() or not virtual.isascii():
        raise LimitsFormatError("virtual-memory must be a whole number of bytes")
    devices = tuple(d for d in values.get("devices", "").split(",") if d)
    return Limits(memory=memory, cores=cores, devices=devices, account=values.get("account", ""),
                  virtual_memory=int(virtual))


# The GPU inventory, which the node agent writes (atomically: readers never see
# half a file) and the hook reads to map indices to UUIDs and to know how much
# memory each GPU can give out. ``memory`` is the GPU's total in bytes. The MIG
# devices of a GPU in MIG mode come before it, with its index: a reader that
# maps indices to the last entry of each gets the GPU.
INVENTORY_VERSION = 1
INVENTORY_NAME = "gpus.json"  # in the hook's state directory


def is_mig(uuid: str) -> bool:
    """Whether ``uuid`` names a MIG device (as NVIDIA's tools do, in any case)."""
    return uuid[:4].upper() == "MIG-"


class InventoryError(ContractError):
    """The inventory file exists but cannot be used; the message says why."""

    fix = "restart the node agent: it rewrites the inventory"


class Gpu(Record):
    """One GPU of the node: its UUID, its index, its total memory in bytes; as published for
    placement also the percent of its time its shares may add up to (``cores``) and the most
    shared containers it takes (``sharers``, 0: no cap)."""

    _fields = ("uuid", "index", "memory", "cores", "sharers")
    __slots__ = _fields
    _defaults = (CORES_PER_GPU, 0)
    uuid: str
    index: int
    memory: int
    cores: int
    sharers: int


def write_inventory(path: str, gpus: list[Gpu]) -> None:
    """Replace the inventory at ``path`` with ``gpus``, atomically."""
    import json  # only the node agent writes: the hook, which only reads, need not load it

    body = {
        "version": INVENTORY_VERSION,
        "gpus": [{"uuid": g.uuid, "index": g.index, "memory": g.memory} for g in gpus],
    }
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(body, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def read_inventory(path: str) -> dict[str, Gpu] | None:
    """Return the GPUs by UUID, or None when the file does not exist."""
    try:
        with open(path, "rb") as src:
            text = src.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InventoryError(f"GPU inventory {path} cannot be read: {exc.strerror}") from None
    from runtime_hook import fast_json

    try:
        body = fast_json.loads(text)
        if body["version"] != INVENTORY_VERSION:
            raise InventoryError(f"GPU inventory {path} has version {body['version']!r}")
        gpus = [_gpu(entry) for entry in body["gpus"]]
    except InventoryError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise InventoryError(f"GPU inventory {path} is malformed ({exc!r})") from None
    return {g.uuid: g for g in gpus}


def _gpu(entry: dict) -> Gpu:
    uuid, index, memory = entry["uuid"], entry["index"], entry["memory"]
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"uuid {uuid!r}")
    for name, value in (("index", index), ("memory", memory)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} {value!r} of {uuid}")
    return Gpu(uuid=uuid, index=index, memory=memory)


# vcuda-run's private directory, one a command, under its $TMPDIR: the node
# agent finds running commands and their limits by these names.
RUN_DIR_PREFIX = "vcuda-run-"
RUN_OWNER_FILE = "owner"
RUN_LIMITS_FILE = "limits"
RUN_LIMITS_ENV = "VCUDA_LIMITS_FILE"  # names the limits file in the command's environment
