"""Bind: choose the pod's GPUs against the node's ledger as last seen (the extender's view of
the nodes; the API's copy after a conflict), write the ledger only if no one else wrote the node
meanwhile, then bind the pod with its assignment in one write.

Each write is conditional on the resourceVersion it was computed from, so two extenders (or
two binds of one) never give out the same room; a conflict means "read again and redo". Binds
of this process to one node take turns on its ledger (``extender.turns``), so they meet no
conflict among themselves; no turn is held across the Binding. The binds that arrive for a
node while its turn is taken are written together in one ledger write when it comes, each
placed after the ones before it: with binpack a burst goes to one node, and one write a bind
would make that node's write time the cluster's bind rate. If the Binding fails, the ledger
line is taken back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import quote

from extender.errors import ExtenderError
from extender.metrics import Metrics
from extender.nodes import Meta, NodeView
from extender.policy import (
    Demand,
    DemandError,
    Unfit,
    ledger_entries,
    ledger_text,
    node_gpus,
    place,
    pod_demand,
    wrote_ledger,
)
from extender.turns import NodeTurns
from extender.wire import BindingArgs
from runtime_hook.contract import ASSIGNMENT_ANNOTATION, LEDGER_ANNOTATION
from runtime_hook.placement import (
    Assignment,
    Entry,
    PlacementError,
    encode_assignment,
)
from webhook.kube import Kube, KubeError

ATTEMPTS = 16  # conflicts in a row before giving up (the scheduler then retries the pod)


class BindError(ExtenderError, RuntimeError):
    """The pod cannot be bound; the message is what its events show."""


class Binder:
    """Binds pods for one extender; holds no state beyond its settings and the view of the
    nodes, which its ledger writes keep up to date."""

    def __init__(self, kube: Kube, nodes: NodeView, core_keys: tuple[str, ...], strategy: str,
                 max_age: float, clock: Callable[[], float] = time.time) -> None:
        self._kube = kube
        self._nodes = nodes
        self.metrics = Metrics()  # the extender's, shared with the verbs' server
        self._core_keys = core_keys
        self._strategy = strategy
        self._max_age = max_age
        self._clock = clock
        self._turns = NodeTurns()
        self._batches: dict[str, list[_Ask]] = {}  # by node: the asks waiting for its turn

    async def bind(self, args: BindingArgs, sent: dict | None = None,
                   expected: Assignment | None = None) -> Assignment:
        """Record the pod's GPUs in the node's ledger and bind it; raise BindError if not.

        ``sent``: the pod as the scheduler sent it to filter, if this process saw it; read from
        the API otherwise. The Binding's preconditions (uid, resourceVersion) refuse it if the
        pod changed since. ``expected``: the GPUs filter found on this node, taken where they
        still fit.
        """
        pod_path = f"/api/v1/namespaces/{quote(args.pod_namespace)}/pods/{quote(args.pod_name)}"
        metadata = (sent or {}).get("metadata") or {}
        if (metadata.get("name"), metadata.get("namespace")) == (args.pod_name,
                                                                 args.pod_namespace):
            pod = sent or {}
        else:
            pod = await self._read(pod_path, f"pod {args.pod_namespace}/{args.pod_name}")
            metadata = pod.get("metadata") or {}
        if metadata.get("uid") != args.pod_uid:
            raise _replaced(args, metadata.get("uid"))
        try:
            demand = pod_demand(pod, self._core_keys)
        except DemandError as exc:
            raise BindError(str(exc)) from None
        if not demand:  # not a vcuda pod: nothing to record
            await self._bind(args, metadata.get("resourceVersion"), None, pod_path)
            return Assignment(None, ())
        who = f"{args.pod_namespace}/{args.pod_name}"
        assignment = await self._reserve(args.node, _Ask(args.pod_uid, who, demand, expected))
        try:
            await self._bind(args, metadata.get("resourceVersion"), assignment, pod_path)
        except BindError:
            async with self._turns.of(args.node):
                await self._release(args.node, args.pod_uid)
            raise
        return assignment

    async def _reserve(self, node: str, ask: _Ask) -> Assignment:
        """Write ``ask``'s line in the node's ledger with the other asks that wait for the
        node's turn with it; its assignment."""
        batch = self._batches.get(node)
        if batch is not None:  # its first ask waits for the turn and writes it
            batch.append(ask)
            return await ask.answer
        batch = self._batches[node] = [ask]
        try:
            async with self._turns.of(node):
                if self._batches.get(node) is batch:  # later asks start the next batch
                    del self._batches[node]
                await self._reserve_batch(node, batch)
        except BaseException as exc:
            failure = exc if isinstance(exc, BindError) else BindError(
                f"node {node}: the bind writing its GPU ledger stopped; the scheduler will try "
                "again")
            for other in batch:  # this bind's own ask is answered by the raise
                if other is not ask and not other.answer.done():
                    other.answer.set_exception(failure)
            raise
        finally:
            if self._batches.get(node) is batch:
                del self._batches[node]
        return await ask.answer

    async def _reserve_batch(self, node: str, asks: list[_Ask]) -> None:
        """Place ``asks`` one after the other on the node as last seen (read again after a
        conflict) and write all their lines at once; answer each (an ask that does not fit
        gets its BindError)."""
        path = f"/api/v1/nodes/{quote(node)}"
        seen = self._nodes.get(node) if self._nodes.ready else None
        for _ in range(ATTEMPTS):
            version: str | None
            if seen is not None:  # as last seen; if it moved on since, the write says so
                version, annotations = seen.version, seen.annotations or {}
                seen = None
            else:
                stored = await self._read(path, f"node {node}")
                metadata = stored.get("metadata") or {}
                version = metadata.get("resourceVersion")
                annotations = metadata.get("annotations") or {}
            ledger = self._ledger(annotations, node)
            now = self._clock()
            answers: list[Assignment | BindError] = []
            placed: list[tuple[str, Assignment]] = []  # written by this batch, in order
            for ask in asks:
                if ask.uid in ledger:  # a retried bind whose first try wrote the ledger
                    answers.append(ledger[ask.uid].assignment)
                    continue
                try:
                    view = node_gpus(node, annotations, now, self._max_age, placed)
                    assignment = place(view, ask.demand, self._strategy,
                                       ask.expected).assignment
                except Unfit as exc:
                    answers.append(BindError(f"node {node}: {exc.reason}"))
                    continue
                placed.append((ask.uid, assignment))
                ledger[ask.uid] = Entry(ask.who, int(now), assignment)
                answers.append(assignment)
            if not placed or await self._write_ledger(node, version, ledger):
                for ask, answer in zip(asks, answers, strict=True):
                    if ask.answer.done():  # its bind was cancelled meanwhile
                        continue
                    if isinstance(answer, BindError):
                        ask.answer.set_exception(answer)
                    else:
                        ask.answer.set_result(answer)
                return
            self.metrics.conflict("ledger")
        raise BindError(f"node {node}: its GPU ledger changed {ATTEMPTS} times while binding; "
                        "the scheduler will try again")

    async def _release(self, node: str, uid: str) -> None:
        path = f"/api/v1/nodes/{quote(node)}"
        for _ in range(ATTEMPTS):
            try:
                stored = await self._kube.get(path)
            except KubeError:
                return  # the node agent prunes lines of pods that never came
            metadata = stored.get("metadata") or {}
            try:
                ledger = dict(ledger_entries(
                    (metadata.get("annotations") or {}).get(LEDGER_ANNOTATION)))
            except PlacementError:
                return
            if ledger.pop(uid, None) is None:
                return
            try:
                if await self._write_ledger(node, metadata.get("resourceVersion"), ledger):
                    return
            except BindError:
                return

    async def _write_ledger(self, node: str, version: str | None,
                            ledger: dict[str, Entry]) -> bool:
        """Write ``ledger`` if the node is still at ``version``; False on a conflict. The view
        takes the node as written: the next filter counts it without waiting for the watch."""
        text = ledger_text(ledger)
        body = {"metadata": {"resourceVersion": version, "annotations": {LEDGER_ANNOTATION: text}}}
        try:
            written = await self._kube.merge_patch(f"/api/v1/nodes/{quote(node)}", body)
        except KubeError as exc:
            if exc.status == 409:
                return False
            raise BindError(f"cannot write the GPU ledger of {node}: {exc.message}") from None
        wrote_ledger(text, ledger)
        metadata = written.get("metadata") or {}
        if isinstance(metadata.get("resourceVersion"), str) and self._nodes.get(node):
            self._nodes.put(Meta(node, metadata["resourceVersion"],
                                 metadata.get("annotations") or {}))
        return True

    async def _bind(self, args: BindingArgs, version: str | None,
                    assignment: Assignment | None, pod_path: str) -> None:
        """Create the Binding, carrying the assignment onto the pod in the same write.

        The API copies a Binding's annotations onto the pod and refuses it (409) if the pod's
        uid or resourceVersion moved on, or if the pod is bound already.
        """
        who = f"pod {args.pod_namespace}/{args.pod_name}"
        metadata: dict[str, object] = {"name": args.pod_name, "namespace": args.pod_namespace,
                    "uid": args.pod_uid, "resourceVersion": version}
        if assignment is not None:
            metadata["annotations"] = {ASSIGNMENT_ANNOTATION: encode_assignment(assignment)}
        for _ in range(3):
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                       "target": {"apiVersion": "v1", "kind": "Node", "name": args.node}}
            try:
                await self._kube.post(f"{pod_path}/binding", binding)
                return
            except KubeError as exc:
                if exc.status != 409:
                    raise BindError(f"binding {who} to {args.node} failed: {exc.message}") \
                        from None
            pod = await self._read(pod_path, who)
            bound_to = (pod.get("spec") or {}).get("nodeName")
            uid = (pod.get("metadata") or {}).get("uid")
            if uid != args.pod_uid:
                raise _replaced(args, uid)
            if bound_to == args.node:
                return  # an earlier try of this bind went through
            if bound_to:
                raise BindError(f"{who} is bound to {bound_to} already")
            metadata["resourceVersion"] = (pod.get("metadata") or {}).get("resourceVersion")
            self.metrics.conflict("binding")
        raise BindError(f"pod {args.pod_namespace}/{args.pod_name} kept changing while it was "
                        "bound; the scheduler will try again")

    async def _read(self, path: str, what: str) -> dict:
        try:
            return await self._kube.get(path)
        except KubeError as exc:
            raise BindError(f"cannot read {what}: {exc.message}") from None

    @staticmethod
    def _ledger(annotations: dict, node: str) -> dict[str, Entry]:
        try:
            return dict(ledger_entries(annotations.get(LEDGER_ANNOTATION)))
        except PlacementError as exc:
            raise BindError(f"node {node}: {exc}") from None


class _Ask:
    """One bind's ask for room on a node, and the future of its answer."""

    __slots__ = ("answer", "demand", "expected", "uid", "who")

    def __init__(self, uid: str, who: str, demand: Demand, expected: Assignment | None) -> None:
        self.uid, self.who, self.demand, self.expected = uid, who, demand, expected
        self.answer: asyncio.Future[Assignment] = asyncio.get_running_loop().create_future()


def _replaced(args: BindingArgs, uid: object) -> BindError:
    return BindError(f"pod {args.pod_namespace}/{args.pod_name} was replaced (uid {uid}, not "
                     f"{args.pod_uid}); nothing bound")
