"""The placement policy: what a pod needs, which GPUs of a node can hold it, how good a node is,
and the GPUs it gets. Pure: a pod's and nodes' fields in, decisions out.

A pod's *shared* need is one GPU's worth of ``cores`` (percent) and ``memory`` (bytes) for all of
its shared containers: app containers and sidecars run together (their needs add up), init
containers run one at a time before them (the largest counts). A container with shares of
several GPUs (``"gpus": N`` in its limits entry) makes it that need on each of ``gpus`` distinct
GPUs (the most any of its containers asks for): every share of the pod is counted on each. Its
*whole* need is a number of GPUs that nothing else uses, counted the same way. A GPU given
whole is never shared, and the other way round.
"""

from __future__ import annotations

import itertools
import struct
import sys
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import msgspec

from extender.errors import ExtenderError
from extender.memo import Memo
from runtime_hook.contract import (
    CORES_PER_GPU,
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    LIMITS_ANNOTATION,
    MAX_GPU_MEMORY,
    SHARED_RESOURCE,
    SHARES,
    WHOLE_RESOURCE,
    ContractError,
    Gpu,
    entry_gpus,
    entry_limits,
    limits_table,
)
from runtime_hook.placement import (
    Assignment,
    Entry,
    Inventory,
    PlacementError,
    decode_inventory,
    decode_ledger,
    ledger_document,
)

STRATEGIES = ("binpack", "spread")
_encode_json = msgspec.json.Encoder().encode
MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority
_GPU_WEIGHT = 0.7  # in a node's score, the chosen GPU's fill against the whole node's
_GIB = 1 << 30


class DemandError(ExtenderError, ValueError):
    """The pod's vcuda fields cannot be read; the message tells its owner what to fix."""


class Demand:
    """A pod's need: ``cores`` and ``memory`` on each of ``gpus`` shared GPUs (0, 0: none),
    ``whole`` GPUs."""

    __slots__ = ("cores", "gpus", "memory", "whole")

    def __init__(self, cores: int, memory: int, whole: int, gpus: int = 1) -> None:
        self.cores, self.memory, self.whole = cores, memory, whole
        self.gpus = gpus if cores else 1

    def __bool__(self) -> bool:
        return bool(self.cores or self.whole)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Demand) and (self.cores, self.memory, self.whole,
                                              self.gpus) == (other.cores, other.memory,
                                                             other.whole, other.gpus)

    def __repr__(self) -> str:
        return (f"Demand(cores={self.cores}, memory={self.memory}, whole={self.whole}, "
                f"gpus={self.gpus})")

    def describe(self) -> str:
        parts = []
        if self.cores:
            each = "one GPU" if self.gpus == 1 else f"each of {self.gpus} GPUs"
            parts.append(f"{_percent(self.cores)} and {_gib(self.memory)} of {each}")
        if self.whole:
            parts.append(f"{self.whole} whole GPU{'s' if self.whole > 1 else ''}")
        return " and ".join(parts)


def pod_demand(pod: Mapping[str, Any], core_keys: Iterable[str]) -> Demand:
    """Read a pod's need from its ``vcuda.io/limits`` annotation and its containers' limits.

    Args:
        pod: the Pod as JSON (``metadata`` and ``spec`` are read), with the types the API server
            gives its fields (:func:`extender.wire.parse_args` checks them).
        core_keys: the ``<domain>/vcuda-core`` resource names the webhook accepts.
    """
    spec = pod.get("spec") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    shares = _shares(annotations.get(LIMITS_ANNOTATION))
    core_keys = tuple(core_keys)
    running = [0, 0, 0]  # cores, memory, whole of what runs together
    largest_init = [0, 0, 0]
    gpus = 1
    for list_name in ("initContainers", "containers"):
        for container in spec.get(list_name) or ():
            *need, container_gpus = _container_need(container, shares, core_keys)
            gpus = max(gpus, container_gpus)
            sidecar = list_name == "initContainers" and container.get("restartPolicy") == "Always"
            if list_name == "containers" or sidecar:
                running = [a + b for a, b in zip(running, need)]
            else:
                largest_init = [max(a, b) for a, b in zip(largest_init, need)]
    cores, memory, whole = (max(a, b) for a, b in zip(running, largest_init))
    if cores >= CORES_PER_GPU:
        raise DemandError(f"the pod's shared containers ask for {_percent(cores)} of one GPU "
                          f"together, more than a share ({SHARES}); give them fewer cores, or "
                          "whole GPUs")
    if memory > MAX_GPU_MEMORY:
        raise DemandError("the pod's shared containers ask for more memory of one GPU "
                          f"together than any GPU has ({MAX_GPU_MEMORY / (1 << 50):g} PiB); their "
                          f"entries in {LIMITS_ANNOTATION} are written by the vcuda webhook: "
                          "recreate the pod through it")
    return Demand(cores, memory, whole, gpus)


def _shares(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        return limits_table(raw)
    except ContractError:
        raise DemandError(f"the pod's {LIMITS_ANNOTATION} annotation is not a JSON object; it "
                          "is written by the vcuda webhook: recreate the pod through it") from None


def _container_need(container: Mapping[str, Any], shares: Mapping[str, Any],
                    core_keys: tuple[str, ...]) -> tuple[int, int, int, int]:
    """A container's cores, memory and whole GPUs, and how many GPUs its share is on."""
    name = container.get("name", "")
    limits = (container.get("resources") or {}).get("limits") or {}
    raw = next((limits[key] for key in core_keys if key in limits), None)
    if raw is None:  # whole GPUs asked for by the device plugin's name, or no GPU
        if limits.get(SHARED_RESOURCE, "0") != "0":
            raise DemandError(f'container "{name}" asks for {SHARED_RESOURCE} itself: a share '
                              f"is asked for as {core_keys[0]} and its memory, which the vcuda "
                              "webhook turns into that resource with the share's limits")
        cores = CORES_PER_GPU * _count(limits.get(WHOLE_RESOURCE, "0"), name)
    else:
        cores = _count(raw, name)
    if cores == 0:
        return 0, 0, 0, 1
    if cores >= CORES_PER_GPU and cores % CORES_PER_GPU == 0:
        return 0, 0, cores // CORES_PER_GPU, 1
    try:
        entry = entry_limits(shares, name)
        gpus = 1 if entry is None else entry_gpus(shares, name)
    except ContractError:
        entry = None
    if entry is None:
        raise DemandError(f'container "{name}" shares a GPU but has no valid entry in '
                          f"{LIMITS_ANNOTATION}; that annotation is written by the vcuda "
                          "webhook: recreate the pod through it")
    cores, memory = entry
    return cores, memory, 0, gpus


_MAX_COUNT_DIGITS = 6  # a GPU limit's digits: 999999 is ten thousand GPUs


def _count(text: str, container: str) -> int:
    """A GPU limit: plain decimal digits, as the API server writes a whole quantity."""
    if not (0 < len(text) <= _MAX_COUNT_DIGITS and text.isascii() and text.isdigit()):
        raise DemandError(f'container "{container}": its GPU limit is not a whole number; the '
                          "vcuda webhook should have denied it: is it installed?")
    return int(text)


class GpuUse:
    """One GPU of a node and what is given out on it; what placing a pod reads of it is worked
    out once, as a node's GPUs are asked about pod after pod."""

    __slots__ = ("cores", "filled", "free_cores", "free_memory", "full", "gpu", "idle",
                 "memory", "pods", "whole")

    def __init__(self, gpu: Gpu, cores: int = 0, memory: int = 0, whole: bool = False,
                 pods: int = 0) -> None:
        self.gpu = gpu
        self.cores = cores  # percent given to shared containers
        self.memory = memory  # bytes given to shared containers
        self.whole = whole  # given whole to one pod
        self.pods = pods
        self.free_cores = 0 if whole else gpu.cores - cores
        self.free_memory = 0 if whole else max(gpu.memory - memory, 0)
        self.full = bool(gpu.sharers) and pods >= gpu.sharers  # no room for one more sharer
        self.idle = not whole and pods == 0  # nothing on it: it may be given whole
        self.filled = self.fill()

    def fill(self, cores: int = 0, memory: int = 0) -> float:
        """The larger of its core and memory use, 0..1, after adding ``cores`` and ``memory``."""
        if self.whole:
            return 1.0
        by_memory = (self.memory + memory) / self.gpu.memory if self.gpu.memory else 1.0
        return max((self.cores + cores) / self.gpu.cores, by_memory)

    def describe(self) -> str:
        if self.whole:
            return f"GPU {self.gpu.index} is given whole"
        if self.full:
            return (f"GPU {self.gpu.index} has {self.pods} sharer{'s' if self.pods != 1 else ''}"
                    ", the most its node allows on one GPU")
        return (f"GPU {self.gpu.index} has {_percent(self.free_cores)} and "
                f"{_gib(self.free_memory)} free")


class NodeGpus:
    """A node's GPUs with what its ledger (and binds not yet seen in it) gives out."""

    __slots__ = ("filled", "gpus", "idle", "name")

    def __init__(self, name: str, gpus: list[GpuUse]) -> None:
        self.name = name
        self.gpus = gpus
        self.idle = [g for g in gpus if g.idle]
        self.filled = sum(g.filled for g in gpus)

    def largest_free_block(self) -> int:
        """Memory of the GPU with the most free memory for a new share: fragmentation's measure."""
        return max((g.free_memory for g in self.gpus if g.free_cores > 0 and not g.full),
                   default=0)


# Why a node can take no vcuda pod at all (an Unfit that is final): the causes metrics count.
# not_vcuda_node: not among the Nodes labelled vcuda.io/enabled=true that the extender watches.
NOT_VCUDA_NODE, NO_INVENTORY, UNREADABLE_INVENTORY, STALE_INVENTORY = (
    "not_vcuda_node", "no_inventory", "unreadable_inventory", "stale_inventory")
NODE_CAUSES = (NOT_VCUDA_NODE, NO_INVENTORY, UNREADABLE_INVENTORY, STALE_INVENTORY)


class Unfit(ExtenderError):
    """The node cannot hold the pod; ``reason`` is what the pod's events show.

    ``cause``: one of NODE_CAUSES when no change of other pods would help (the node's inventory
    is missing, unreadable or stale), else empty; ``note``: the reason in words that stay the
    same while the cause lasts (an Event on the node), by default the reason.
    """

    def __init__(self, reason: str, cause: str = "", note: str = "") -> None:
        super().__init__(reason)
        self.reason, self.cause, self.note = reason, cause, note or reason

    @property
    def final(self) -> bool:
        """Whether no change of other pods would help."""
        return bool(self.cause)


def node_gpus(name: str, annotations: Mapping[str, str] | None, now: float, max_age: float,
              pending: Collection[tuple[str, Assignment]] = (), ignore: str = "") -> NodeGpus:
    """Read a node's inventory and ledger; raise Unfit when it cannot take vcuda pods.

    Args:
        name: the node's name.
        annotations: its ``metadata.annotations``.
        now: the time (Unix seconds) to judge the inventory's heartbeat by.
        max_age: seconds after which an inventory is stale.
        pending: (pod uid, assignment) of binds written but perhaps not in these annotations.
        ignore: a pod uid not to count (the pod being placed, if a failed bind left it there).
    """
    node = _read(annotations, now, max_age)
    return _node(name, node.inventory, _current(node, pending, ignore))


def _current(node: _Decoded, pending: Collection[tuple[str, Assignment]],
             ignore: str) -> _Usage:
    """A node's usage by its ledger, with the pending binds it does not hold yet added and the
    pod ``ignore`` taken off (a failed bind may have left its line)."""
    counted, usage = node.counted, node.usage
    if not pending and ignore not in counted:  # most nodes, most of the time
        return usage
    seen = set(counted)
    seen.add(ignore)
    extra = []
    for uid, assignment in pending:
        if uid not in seen:
            extra.append(assignment)
            seen.add(uid)
    if ignore in counted:
        usage = _added(node.inventory, usage, (counted[ignore],), -1)
    return _added(node.inventory, usage, extra) if extra else usage


def _node(name: str, inventory: Inventory, usage: _Usage) -> NodeGpus:
    gpus = [GpuUse(gpu, cores, memory, bool(whole), pods)
            for gpu, (cores, memory, whole, pods) in zip(inventory.gpus, _ROW.iter_unpack(usage))]
    return NodeGpus(name, sorted(gpus, key=lambda g: g.gpu.index))


def recorded(annotations: Mapping[str, str] | None) -> tuple[Collection[str], float | None]:
    """The pod uids a node's ledger holds and when its agent last published its GPUs (its
    heartbeat, node's clock); ``((), None)`` without a usable inventory."""
    annotations = annotations or {}
    raw = annotations.get(INVENTORY_ANNOTATION)
    if raw is None:
        return (), None
    try:
        node = _decoded(raw, annotations.get(LEDGER_ANNOTATION))
    except PlacementError:
        return (), None
    return node.counted, node.inventory.heartbeat


def unreadable(annotations: Mapping[str, str] | None) -> str | None:
    """Why a node's vcuda annotations cannot be read (None: they can, or it has none), decoding
    them as placement will: the node's watch asks once per change of them."""
    annotations = annotations or {}
    raw = annotations.get(INVENTORY_ANNOTATION)
    if raw is None:
        return None
    try:
        _decoded(raw, annotations.get(LEDGER_ANNOTATION))
    except PlacementError as exc:
        return str(exc)
    return None


def placement(name: str, annotations: Mapping[str, str] | None, demand: Demand,
              strategy: str, now: float, max_age: float,
              pending: Collection[tuple[str, Assignment]] = (), ignore: str = "") -> Placement:
    """:func:`place` on :func:`node_gpus` (same arguments), answered from memory when the node's
    GPUs, what is given out on them (its ledger and the binds pending on it) and the demand were
    seen before: filter and prioritize ask the same question, and so do pods of one size. Binds
    in flight are on many nodes while a burst binds (with spread, on nearly all of them), and a
    bind that moves from pending to the ledger changes nothing given out: the answer holds."""
    node = _read(annotations, now, max_age)
    usage = _current(node, pending, ignore)
    key = (node.gpus_id, usage, demand.cores, demand.memory, demand.whole, demand.gpus, strategy)
    answer = _answers.get(key)
    if answer is None:
        try:
            answer = place(_gpus_of(node.gpus_id, node.inventory, usage), demand, strategy)
        except Unfit as unfit:
            answer = unfit
        _answers.put(key, answer, _ANSWER_COST + sys.getsizeof(usage))
    if isinstance(answer, Unfit):
        raise Unfit(answer.reason, answer.cause)
    return answer


def _gpus_of(gpus_id: int, inventory: Inventory, usage: _Usage) -> NodeGpus:
    """A node's GPUs as :func:`placement` reads them (nameless), once per state: many pod sizes
    are asked about one state of a node. ``inventory`` lists the GPUs of ``gpus_id``."""
    key = (gpus_id, usage)
    gpus = _states.get(key)
    if gpus is None:
        gpus = _states.put(key, _node("", inventory, usage),
                           sys.getsizeof(usage) + _GPU_USE_COST * len(inventory.gpus))
    return gpus


def _read(annotations: Mapping[str, str] | None, now: float, max_age: float) -> _Decoded:
    """A node's decoded annotations; raise Unfit (final) when it has no usable, fresh ones."""
    annotations = annotations or {}
    raw = annotations.get(INVENTORY_ANNOTATION)
    if raw is None:
        raise Unfit("no vcuda GPU inventory: the vcuda node agent does not run on this node",
                    NO_INVENTORY)
    try:
        node = _decoded(raw, annotations.get(LEDGER_ANNOTATION))
    except PlacementError as exc:
        raise Unfit(f"{exc}: check the vcuda node agent of this node",
                    UNREADABLE_INVENTORY) from None
    age = now - node.inventory.heartbeat
    if age > max_age:
        raise Unfit(f"the vcuda node agent last published this node's GPUs {age:.0f} s ago "
                    f"(limit {max_age:.0f} s): check its vcuda-node pod", STALE_INVENTORY,
                    f"the vcuda node agent has not published this node's GPUs for over "
                    f"{max_age:.0f} s, so no vcuda pod is placed here: check its vcuda-node pod")
    return node


# Each GPU's (cores, memory, whole, pods) given out, in the inventory's order: with the GPUs,
# all a placement depends on. Not the ledger's text: a bind pending, then in the ledger, then
# no longer pending leaves it as it was, and the answers remembered for it hold. Packed as
# int64s, since bytes keep their hash: the answers are looked up for every node of every
# call, and a tuple of tuples would be hashed anew each time (8% of filter at 1,000 nodes).
_Usage = bytes
_ROW = struct.Struct("<4q")
_MOST = (1 << 62) - 1  # a sum past it is past any GPU's room: it stays there, in an int64

# What the memos below may hold, in bytes as charged (the extender's limit is 512 MiB): each
# node's values, decoded once per distinct text, however large or often rewritten they are
# (within the bounds of runtime_hook.placement).
INVENTORY_BYTES = 16 << 20
LEDGER_BYTES = 32 << 20
NODE_BYTES = 16 << 20
GPU_SET_BYTES = 8 << 20
STATE_BYTES = 16 << 20
ANSWER_BYTES = 16 << 20
# What one decoded item holds beyond its key's text, measured (tests/extender/test_memory.py).
_GPU_COST = 200  # a Gpu and its UUID, in an inventory or a set of GPUs
_ENTRY_COST = 500  # a ledger's Entry, its Assignment, the pod's name and uid
_COUNTED_COST = 50  # a pod's place in a decoded node's ``counted``
_GPU_USE_COST = 250  # a GpuUse of a node's state
_ANSWER_COST = 450  # a Placement or an Unfit, and its key
_ERROR_COST = 250  # the message kept for a value that cannot be read, beyond its text


class _Decoded:
    """A node's two annotations decoded: its inventory, the id of the set of GPUs it lists
    (answers are kept by it: they outlive heartbeats), each GPU's use by its ledger, and the
    assignments of the pods that ledger counts."""

    __slots__ = ("counted", "gpus_id", "inventory", "usage")

    def __init__(self, inventory: Inventory, gpus_id: int, usage: _Usage,
                 counted: dict[str, Assignment]) -> None:
        self.inventory, self.gpus_id, self.usage, self.counted = (inventory, gpus_id, usage,
                                                                  counted)


# A value that cannot be read is remembered by its error's message (an exception raised again
# would grow its traceback each time).
_nodes: Memo[tuple[str, str | None], _Decoded | str] = Memo(NODE_BYTES)
_inventories: Memo[str, tuple[Inventory, int] | str] = Memo(INVENTORY_BYTES)
_gpu_sets: Memo[tuple[Gpu, ...], int] = Memo(GPU_SET_BYTES)
_ledgers: Memo[str, Mapping[str, Entry] | str] = Memo(LEDGER_BYTES)
_states: Memo[tuple[int, _Usage], NodeGpus] = Memo(STATE_BYTES)
_answers: Memo[tuple[int, _Usage, int, int, int, int, str], Placement | Unfit] = Memo(
    ANSWER_BYTES)
_gpu_set_ids = itertools.count()


def _decoded(inventory_text: str, ledger_text: str | None) -> _Decoded:
    """A node's two annotations, decoded once per distinct pair of texts (the scheduler sends
    the same ones pod after pod); raise PlacementError when either cannot be read."""
    key = (inventory_text, ledger_text)
    node = _nodes.get(key)
    if node is None:
        try:
            inventory, gpus_id = _inventory(inventory_text)
            counted = {uid: entry.assignment
                       for uid, entry in ledger_entries(ledger_text).items()}
            usage = _added(inventory, bytes(_ROW.size * len(inventory.gpus)), counted.values())
            node = _Decoded(inventory, gpus_id, usage, counted)
            cost = sys.getsizeof(usage) + _COUNTED_COST * len(counted)
        except PlacementError as exc:
            node = str(exc)
            cost = _ERROR_COST + sys.getsizeof(node)
        _nodes.put(key, node, cost + _text_cost(inventory_text) + _text_cost(ledger_text))
    if isinstance(node, str):
        raise PlacementError(node)
    return node


def _inventory(text: str) -> tuple[Inventory, int]:
    """An inventory decoded once, and the id of its set of GPUs: it changes with the agent's
    heartbeat, not with binds. Each agent pass writes a new heartbeat, which changes the text
    but not where a pod fits."""
    found = _inventories.get(text)
    if found is None:
        try:
            inventory = decode_inventory(text)
        except PlacementError as exc:
            found = str(exc)
            cost = _ERROR_COST + sys.getsizeof(found)
        else:
            gpus_id = _gpu_sets.get(inventory.gpus)
            if gpus_id is None:
                gpus_id = _gpu_sets.put(inventory.gpus, next(_gpu_set_ids),
                                        _GPU_COST * len(inventory.gpus))
            found, cost = (inventory, gpus_id), _GPU_COST * len(inventory.gpus)
        _inventories.put(text, found, cost + _text_cost(text))
    if isinstance(found, str):
        raise PlacementError(found)
    return found


def ledger_entries(text: str | None) -> Mapping[str, Entry]:
    """The entries of a ledger annotation (None: none), decoded once per distinct text; raise
    PlacementError when it is malformed. Shared: copy them to change them."""
    if text is None:
        return {}
    entries = _ledgers.get(text)
    if entries is None:
        try:
            entries = wrote_ledger(text, decode_ledger(text))
        except PlacementError as exc:
            entries = str(exc)
            _ledgers.put(text, entries, _ERROR_COST + sys.getsizeof(entries) + _text_cost(text))
    if isinstance(entries, str):
        raise PlacementError(entries)
    return entries


def ledger_text(entries: Mapping[str, Entry]) -> str:
    """The ledger annotation of ``entries``, encoded by msgspec: a bind writes one per pod, and
    json takes three times as long (the hook's side stays standard library only). The text is
    :func:`~runtime_hook.placement.encode_ledger`'s for the ASCII names Kubernetes allows."""
    return _encode_json(ledger_document(entries)).decode()


def wrote_ledger(text: str, entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
    """Note that ``text`` is the ledger annotation of ``entries`` (returned): bind calls it with
    the one it wrote, so the next filter, which is sent that text, does not decode it again."""
    _ledgers.put(text, entries, _text_cost(text) + _ENTRY_COST * len(entries))
    return entries


def _text_cost(text: str | None) -> int:
    return 0 if text is None else sys.getsizeof(text)


def _added(inventory: Inventory, usage: _Usage, assignments: Iterable[Assignment],
           sign: int = 1) -> _Usage:
    """``usage`` with ``assignments`` added (sign 1) or taken off (-1)."""
    where = {gpu.uuid: index * _ROW.size for index, gpu in enumerate(inventory.gpus)}
    rows = bytearray(usage)
    # A GPU the ledger names but the inventory lacks is gone: nothing is placed on it anyway.
    for assignment in assignments:
        for uuid in assignment.shared_gpus():  # each GPU of a share carries all of it
            if assignment.shared and (at := where.get(uuid)) is not None:
                cores, memory, whole, pods = _ROW.unpack_from(rows, at)
                _ROW.pack_into(rows, at, min(cores + sign * assignment.shared[1], _MOST),
                               min(memory + sign * assignment.shared[2], _MOST), whole,
                               pods + sign)
        for uuid in assignment.whole:
            if (at := where.get(uuid)) is not None:
                cores, memory, _, pods = _ROW.unpack_from(rows, at)
                _ROW.pack_into(rows, at, cores, memory, int(sign > 0), pods + sign)
    return bytes(rows)


class Placement:
    """Where a pod would go on one node, and the node's score (0..MAX_SCORE) for it."""

    __slots__ = ("assignment", "score")

    def __init__(self, assignment: Assignment, score: int) -> None:
        self.assignment, self.score = assignment, score


def place(node: NodeGpus, demand: Demand, strategy: str = "binpack",
          prefer: Assignment | None = None) -> Placement:
    """Choose the GPUs of ``node`` for ``demand``; raise Unfit with the reason it does not fit.

    ``prefer``: GPUs to take where they still fit (those filter found, for bind: the extender
    counts a bind in flight there, so a bind that lands elsewhere misleads the next filters).
    """
    idle = node.idle
    shared: list[GpuUse] = []
    if demand.cores:
        shared = _shared_gpus(node, demand, strategy, prefer)
    whole: list[GpuUse] = []
    if demand.whole:
        free = [g for g in idle if g not in shared]
        if len(free) < demand.whole:
            raise Unfit(f"{demand.whole} whole GPU{'s' if demand.whole > 1 else ''} wanted, "
                        f"{len(free)} of {len(node.gpus)} unused")
        preferred = set(prefer.whole) if prefer is not None else set()
        whole = sorted(free, key=lambda g: g.gpu.uuid not in preferred)[:demand.whole]
    assignment = Assignment(
        (shared[0].gpu.uuid, demand.cores, demand.memory) if shared else None,
        tuple(g.gpu.uuid for g in whole), tuple(g.gpu.uuid for g in shared[1:]))
    return Placement(assignment, _score(node, demand, shared, len(whole), strategy))


def _shared_gpus(node: NodeGpus, demand: Demand, strategy: str,
                 prefer: Assignment | None) -> list[GpuUse]:
    """The ``demand.gpus`` distinct GPUs that take the pod's share: those of ``prefer`` that
    still fit, then the fullest (binpack) or emptiest (spread); raise Unfit when too few fit.
    Idle GPUs the whole part needs are left to it."""
    fits = [g for g in node.gpus if not g.full
            and g.free_cores >= demand.cores and g.free_memory >= demand.memory]
    idle_left = len(node.idle) - demand.whole  # idle GPUs the share may take
    if demand.whole and idle_left < demand.gpus:
        fits = _at_most_idle(fits, idle_left)
    if len(fits) < demand.gpus:
        raise Unfit(_no_share_reason(node, demand, len(fits)))
    sign = -1 if strategy == "binpack" else 1
    wanted = prefer.shared_gpus() if prefer is not None else ()
    fits.sort(key=lambda g: (g.gpu.uuid not in wanted,
                             sign * g.fill(demand.cores, demand.memory), g.gpu.index))
    return fits[:demand.gpus]


def _at_most_idle(fits: list[GpuUse], idle: int) -> list[GpuUse]:
    """``fits`` with all but its first ``idle`` idle GPUs (at least none) taken out."""
    kept: list[GpuUse] = []
    for gpu in fits:
        if gpu.idle:
            if idle <= 0:
                continue
            idle -= 1
        kept.append(gpu)
    return kept


def _score(node: NodeGpus, demand: Demand, shared: list[GpuUse], whole: int,
           strategy: str) -> int:
    """Binpack: fuller is better, for the chosen GPUs and the node; spread: emptier is
    better."""
    if not node.gpus:
        return 0
    node_fill = node.filled + whole
    gpu_fills = [g.fill(demand.cores, demand.memory) for g in shared]
    node_fill += sum(gpu_fills) - sum(g.filled for g in shared)
    node_fill /= len(node.gpus)
    fill = node_fill
    if shared:
        gpu_fill = sum(gpu_fills) / len(gpu_fills)
        fill = _GPU_WEIGHT * gpu_fill + (1 - _GPU_WEIGHT) * node_fill
    if strategy == "spread":
        fill = 1.0 - fill
    return max(0, min(MAX_SCORE, round(fill * MAX_SCORE)))


def _no_share_reason(node: NodeGpus, demand: Demand, fitting: int) -> str:
    room = f"{_percent(demand.cores)} and {_gib(demand.memory)} free"
    if any(g.gpu.sharers for g in node.gpus):
        room += " and room for one more sharer"
    open_gpus = [g for g in node.gpus if not g.whole]
    if demand.gpus == 1:
        wanted = f"no GPU has {room}"
    else:
        wanted = (f"{demand.gpus} GPUs with {room} each wanted, {fitting} of "
                  f"{len(node.gpus)} {'has' if fitting == 1 else 'have'} it")
        open_gpus = [g for g in open_gpus if g.full or g.free_cores < demand.cores
                     or g.free_memory < demand.memory]  # the closest of those that do not fit
        if not open_gpus:
            return wanted
    if not open_gpus:
        return f"{wanted}: {'every GPU is given whole' if node.gpus else 'no GPU'}"
    best = max(open_gpus, key=lambda g: (min(g.free_cores / max(demand.cores, 1),
                                             g.free_memory / max(demand.memory, 1)),
                                         -g.gpu.index))
    return f"{wanted} ({best.describe()}, the closest)"


def _percent(cores: int) -> str:
    """Cores in words, never with a '%': kube-scheduler writes the reasons of FailedNodes into
    the pod's FailedScheduling event as a printf format, where '%' starts a verb ("30% and"
    showed as "30%!a(MISSING)nd")."""
    return f"{cores} percent"


def _gib(size: int) -> str:
    return f"{size / _GIB:g} GiB" if size % (_GIB // 4) == 0 else f"{size / _GIB:.2f} GiB"
