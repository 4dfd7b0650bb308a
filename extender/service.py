"""The three extender verbs, body to body: filter and prioritize decide, for the node names the
scheduler sends, from the extender's own view of the nodes (:mod:`extender.nodes`); bind decides
against the node as last seen, and writes it only if it has not changed since.

Besides that view, the only memory kept is of binds this process is making or made in the last
seconds that the view may not show yet ("pending"): counting them keeps a burst of pods
off room already given. A bind counts from the moment it arrives, with the GPUs filter found
for its pod on that node, and with the GPUs it wrote once it wrote them: the scheduler filters
the next pods while earlier binds are still writing. Losing it (a restart) costs at most a bind
that finds the room taken, and the scheduler tries that pod again; it never over-commits, since
bind checks the stored ledger. Besides, the pods sent to filter are kept until their bind,
which then need not read them again; one this process did not see (a restart, another replica)
is read from the API.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Collection

import msgspec

from extender.bind import Binder, BindError
from extender.node_events import NodeEvents
from extender.nodes import SELECTOR, NodeView
from extender.policy import (
    NOT_VCUDA_NODE,
    Demand,
    DemandError,
    Placement,
    Unfit,
    placement,
    pod_demand,
    recorded,
)
from extender.wire import (
    ExtenderArgs,
    binding_result,
    filter_result,
    parse_args,
    parse_binding,
    priority_list,
)
from runtime_hook.placement import Assignment

PENDING_SECONDS = 30.0
# Heartbeats are whole seconds: a copy published this much after a bind was written after it.
_HEARTBEAT_SLACK = 1.0
SENT_PODS = 4096  # pods filtered and not bound yet, kept for their bind (newest)
# Nodes per pod whose GPUs filter found are kept for its bind: the best scored, where the
# scheduler's choice falls; a bind elsewhere is counted once written. Bounds the memory at
# SENT_PODS times this, whatever the cluster's size.
EXPECTED_NODES = 16
NOT_READY = ("the vcuda scheduler extender has not listed the nodes from the API yet (it does at "
             "start and after a watch error); the scheduler will try again")
NOT_VCUDA = (f"not a vcuda node: it is not labelled {SELECTOR}, so the vcuda node agent does "
             "not run there")


class Outcome(msgspec.Struct, frozen=True):
    """An answer and what to log of it."""

    body: bytes
    event: str
    fields: dict


class _Sent:
    """A pod sent to filter, and the GPUs filter found for it on the best nodes it kept."""

    __slots__ = ("gpus", "pod")

    def __init__(self, pod: dict) -> None:
        self.pod = pod
        self.gpus: dict[str, Assignment] = {}


class Extender:
    """filter, prioritize and bind with one placement strategy; a node filter leaves out
    whatever the pod is told to ``events`` (None: to no one)."""

    def __init__(self, binder: Binder, nodes: NodeView, core_keys: tuple[str, ...],
                 strategy: str, max_age: float, clock: Callable[[], float] = time.time,
                 events: NodeEvents | None = None) -> None:
        self._binder = binder
        self._events = events
        self._nodes = nodes
        self.metrics = binder.metrics
        self._core_keys = core_keys
        self._strategy = strategy
        self._max_age = max_age
        self._clock = clock
        self._pending: dict[str, dict[str, tuple[Assignment, float]]] = {}
        self._sent: OrderedDict[str, _Sent] = OrderedDict()

    def filter(self, body: bytes) -> Outcome:
        """Keep the nodes where the pod fits; raise BadArguments for a malformed body."""
        args = parse_args(body)
        sent = self._see(args.pod)
        kept: list[str] = []
        found: list[tuple[int, str, Assignment]] = []  # score, node, GPUs of the kept nodes
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        if not self._nodes.ready:
            failed = dict.fromkeys(args.names, NOT_READY)
            return self._filtered(args, kept, failed, unresolvable)
        try:
            demand = pod_demand(args.pod, self._core_keys)
        except DemandError as exc:
            unresolvable = dict.fromkeys(args.names, str(exc))
            return self._filtered(args, kept, failed, unresolvable)
        uid, now = _pod_uid(args.pod), self._clock()
        for name in args.names:
            try:
                placed = self._place(uid, name, demand, now)
            except Unfit as exc:
                if exc.cause:
                    unresolvable[name] = exc.reason
                    self.metrics.left_out(exc.cause)
                    if self._events is not None:
                        self._events.left_out(name, exc.cause, exc.note)
                else:
                    failed[name] = exc.reason
            else:
                kept.append(name)
                found.append((placed.score, name, placed.assignment))
        if sent is not None:
            sent.gpus = {name: gpus for _, name, gpus in heapq.nlargest(
                EXPECTED_NODES, found, key=lambda item: item[0])}
        return self._filtered(args, kept, failed, unresolvable)

    def prioritize(self, body: bytes) -> Outcome:
        """Score each node 0..10 by the strategy; raise BadArguments for a malformed body."""
        args = parse_args(body)
        scores = []
        try:
            demand = pod_demand(args.pod, self._core_keys)
        except DemandError:
            demand = Demand(0, 0, 0)
        uid, now = _pod_uid(args.pod), self._clock()
        for name in args.names:
            score = 0
            if demand and self._nodes.ready:
                try:
                    score = self._place(uid, name, demand, now).score
                except Unfit:
                    score = 0
            scores.append((name, score))
        return Outcome(priority_list(scores), "prioritize",
                       {"pod": _pod_name(args), "scores": len(scores)})

    async def bind(self, body: bytes) -> Outcome:
        """Bind the pod; raise BadArguments for a malformed body."""
        args = parse_binding(body)
        who = f"{args.pod_namespace}/{args.pod_name}"
        sent = self._sent.pop(args.pod_uid, None)
        expected = sent.gpus.get(args.node) if sent is not None else None
        if expected is not None and expected.gpus():  # counted while the bind writes
            self._remember(args.node, args.pod_uid, expected)
        try:
            assignment = await self._binder.bind(args, sent.pod if sent is not None else None,
                                                 expected)
        except BindError as exc:
            self._drop(args.node, args.pod_uid)
            return Outcome(binding_result(str(exc)), "bind_failed",
                           {"pod": who, "node": args.node, "error": str(exc)})
        if assignment.gpus():
            self._remember(args.node, args.pod_uid, assignment)
        else:
            self._drop(args.node, args.pod_uid)
        return Outcome(binding_result(), "bound",
                       {"pod": who, "node": args.node, "gpus": list(assignment.gpus())})

    def _place(self, uid: str, name: str, demand: Demand, now: float) -> Placement:
        """Where pod ``uid`` goes on node ``name`` as the view shows it at ``now``, binds in
        flight counted; raise Unfit (final for a node the view lacks: not a vcuda node)."""
        node = self._nodes.get(name)
        if node is None:
            raise Unfit(NOT_VCUDA, NOT_VCUDA_NODE)
        annotations = node.annotations
        pending = self._pending.get(name)
        extra: list[tuple[str, Assignment]] = []
        if pending:
            # A bind the node's copy accounts for is counted from there (or is over): forget
            # it, or it would count again once its pod ends and the line is pruned.
            self._forget(name, pending, now, *recorded(annotations))
            extra = [(pod, a) for pod, (a, _) in pending.items()]
        return placement(name, annotations, demand, self._strategy, now, self._max_age, extra,
                         ignore=uid)

    def _see(self, pod: dict) -> _Sent | None:
        """Keep the pod filter was sent, for its bind (which names it only)."""
        uid = _pod_uid(pod)
        if not uid:
            return None
        sent = self._sent[uid] = _Sent(pod)
        self._sent.move_to_end(uid)
        if len(self._sent) > SENT_PODS:
            self._sent.popitem(last=False)
        return sent

    def _remember(self, node: str, uid: str, assignment: Assignment) -> None:
        self._pending.setdefault(node, {})[uid] = (assignment, self._clock())

    def _drop(self, node: str, uid: str) -> None:
        """Stop counting a bind that wrote nothing."""
        pending = self._pending.get(node)
        if pending is not None and pending.pop(uid, None) is not None and not pending:
            del self._pending[node]

    def _forget(self, node: str, pending: dict, now: float, seen: Collection[str],
                heartbeat: float | None) -> None:
        """Drop binds the node's copy accounts for: its ledger shows them, or its agent
        published it after them and their line is gone (the pod ended, the agent pruned it);
        and binds too old to be still unseen. A node clock ahead of ours can make a bind be
        forgotten early: the cost is a bind that finds the room taken, never an over-commit."""
        for uid in [u for u, (_, at) in pending.items()
                    if u in seen or now - at >= PENDING_SECONDS
                    or (heartbeat is not None and heartbeat >= at + _HEARTBEAT_SLACK)]:
            del pending[uid]
        if not pending:
            del self._pending[node]

    def _filtered(self, args: ExtenderArgs, kept: list[str], failed: dict,
                  unresolvable: dict) -> Outcome:
        return Outcome(filter_result(kept, failed, unresolvable), "filter",
                       {"pod": _pod_name(args), "kept": len(kept),
                        "failed": len(failed) + len(unresolvable)})


def _pod_uid(pod: dict) -> str:
    """The pod's uid, or "" when it has none that is a string."""
    uid = (pod.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) else ""


def _pod_name(args: ExtenderArgs) -> str:
    metadata = args.pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
