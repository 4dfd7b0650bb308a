"""A simulated GPU cluster driven through the real interfaces of per-GPU placement.

- The API: one fake API server (TLS, resourceVersions, conditional writes, Bindings), in a
  process of its own (tests/sim/api.py), as kube-apiserver is apart from kube-scheduler.
- The scheduler: a driver that does what kube-scheduler does with an extender configured
  ``nodeCacheCapable: true``: one scheduling cycle at a time, ExtenderArgs with the names of
  the candidate nodes (every node here), ``/filter`` then ``/prioritize`` (the names filter
  kept, each of them one it sent) over HTTP, the best score wins, and ``/bind``
  (ExtenderBindingArgs) is sent at once and
  answered asynchronously, as the binding cycle does (16 in flight at most); a failed bind
  sends the pod back to the queue, a bound pod is started by its node apart from the
  scheduler. Two extender replicas, each its own ``vcuda-scheduler-extender`` process: as shipped,
  each scheduler replica calls the extender beside it on 127.0.0.1 and only the leader
  schedules, so the cycles go to one replica; the leadership moves to the other every
  ``leader_cycles`` cycles, far more often than in a cluster, while the old leader's binds are
  still in flight: the two replicas' binds overlap at every change.
- The nodes: each one runs the node agent's placement part and a fake kubelet that drives
  vcuda's device plugin over its gRPC sockets (Allocate, PreStartContainer, pod resources,
  CDI resolution) for every container that asks for vcuda's resources; all of them in
  processes apart (tests/sim/nodes.py, ``node_processes``), as nodes are machines apart from
  the control plane.

Pods come in bursts, run, and are deleted; an extender replica and some node agents are
restarted mid-run. :func:`run` returns a :class:`Report` of what the issue asks to see.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from extender.policy import Demand, NodeGpus, Unfit, node_gpus, place, pod_demand
from runtime_hook.contract import ASSIGNMENT_ANNOTATION, CORES_PER_GPU
from runtime_hook.placement import Assignment, decode_assignment
from tests.extender.cluster import CORE_KEYS, GIB, ExtenderProcess, binding_args, pod_object
from tests.node.fake_kubelet import StartError
from tests.node.gpu_node import gpus, register
from tests.sim import api as api_process
from tests.sim import nodes

# The simulation's processes: the API and scheduler stand-ins (this one), the nodes, and the
# two extender replicas (filter, prioritize and bind), for what each costs per pod.
PARTS = ("api", "scheduler", "nodes", "extenders")
CYCLE_PARTS = ("cycle", "filter", "prioritize", "bind_slot")
MAX_AGE = 3600.0  # the agents publish every pass; staleness is tested elsewhere
LEDGER_GRACE = 2.0  # seconds a ledger line waits for its pod (a minute on a real node)
BINDS_IN_FLIGHT = 16
# Pods starting at once over all nodes: kubelets start pods whatever the scheduler does, so a
# slow start must not hold one of its bind slots.
STARTS_AT_ONCE = 64


@dataclass
class Scenario:
    """The size of the cluster and of the workload."""

    nodes: int = 4
    gpus_per_node: int = 4
    gpu_sizes: tuple[int, int] = (24 * GIB, 80 * GIB)  # half the nodes of each
    pods: int = 200  # creates in all
    burst: int = 40  # pods created at once
    strategy: str = "binpack"
    whole_share: float = 0.1  # of pods that ask for whole GPUs
    delete_ratio: float = 0.75  # pods deleted after each burst, against the burst's size
    seed: int = 1
    agent_every: float = 0.5  # seconds between node agent passes
    restart_extender_at: float = 0.4  # of the creates made, an extender replica restarts
    restart_agents_at: float = 0.6  # ... and a tenth of the node agents restart
    leader_cycles: int = 20  # scheduling cycles between two changes of leader
    node_processes: int = 1  # processes the nodes are spread over


@dataclass
class Report:
    """What the run showed."""

    created: int = 0
    started: int = 0
    started_on_several_gpus: int = 0  # pods whose share spans two GPUs
    deleted: int = 0
    refused_at_start: list[str] = field(default_factory=list)
    wrong_gpu: list[str] = field(default_factory=list)
    over_committed: list[str] = field(default_factory=list)
    shared_and_whole: list[str] = field(default_factory=list)
    unschedulable_but_fit: list[str] = field(default_factory=list)
    never_placed: int = 0
    bind_failures: int = 0
    bind_errors: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # what went wrong in the simulation itself
    seconds: float = 0.0
    placing_seconds: float = 0.0  # time the queue held pods that some node could take
    # CPU seconds each part used meanwhile (user + system, all its threads), by PARTS.
    placing_cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    # Seconds of placing the scheduler stand-in spent in cycles ("cycle"), and in them waiting
    # for filter's and prioritize's answers and for a bind slot (16 binds in flight at most).
    cycle_seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(CYCLE_PARTS, 0.0))
    largest_free_gib: float = 0.0  # mean over nodes of the largest free block, at the end
    idle_gpus: int = 0  # GPUs with nothing on them, at the end

    def rate(self) -> float:
        """Pods started per second of placing: from a burst's creation until its last pod that
        some node could take has its containers started on their GPUs (or it waits for room),
        the pauses between bursts left out."""
        return self.started / self.placing_seconds if self.placing_seconds else 0.0

    def extender_rate(self) -> float:
        """Pods the extenders placed (filter, prioritize, bind, retries too) per CPU second:
        what one core given to the extender would sustain."""
        seconds = self.placing_cpu["extenders"]
        return self.started / seconds if seconds else 0.0

    def cpu_per_pod(self) -> dict[str, float]:
        """Milliseconds of CPU each part spent per pod started, while placing."""
        return {part: round(1000 * seconds / self.started, 1) if self.started else 0.0
                for part, seconds in self.placing_cpu.items()}

    def cycle_per_pod(self) -> dict[str, float]:
        """Milliseconds of placing per pod started, by what the scheduler waited for; they add
        up to 1000 / pods_per_second."""
        waited = self.cycle_seconds
        parts = {"filter": waited["filter"], "prioritize": waited["prioritize"],
                 "bind_slot": waited["bind_slot"],
                 "rest_of_cycle": waited["cycle"] - waited["filter"] - waited["prioritize"]
                 - waited["bind_slot"],
                 "between_cycles": self.placing_seconds - waited["cycle"]}
        return {part: round(1000 * seconds / self.started, 2) if self.started else 0.0
                for part, seconds in parts.items()}

    def summary(self) -> dict[str, Any]:
        return {"created": self.created, "started": self.started,
                "started_on_several_gpus": self.started_on_several_gpus,
                "deleted": self.deleted,
                "refused_at_start": len(self.refused_at_start),
                "wrong_gpu": len(self.wrong_gpu),
                "over_committed_gpus": len(self.over_committed),
                "gpus_shared_and_whole": len(self.shared_and_whole),
                "unschedulable_although_a_gpu_could_hold_them":
                    len(self.unschedulable_but_fit),
                "never_placed": self.never_placed, "bind_failures": self.bind_failures,
                "simulation_errors": len(self.errors),
                "seconds": round(self.seconds, 1), "pods_per_second": round(self.rate(), 1),
                "cpu_ms_per_pod": self.cpu_per_pod(),
                "cycle_ms_per_pod": self.cycle_per_pod(),
                "extender_pods_per_cpu_second": round(self.extender_rate(), 1),
                "mean_largest_free_block_gib": round(self.largest_free_gib, 2),
                "idle_gpus": self.idle_gpus}


class _Running:
    """A started pod: its object, node and assignment, and the GPUs its containers got."""

    __slots__ = ("assignment", "node", "pod")

    def __init__(self, pod: dict[str, Any], node: str, assignment: Assignment) -> None:
        self.pod, self.node, self.assignment = pod, node, assignment


class Simulation:
    """One run of a :class:`Scenario` in ``root``."""

    def __init__(self, scenario: Scenario, api: Any, api_pid: int, root: Path,
                 host: nodes.Nodes, host_pids: list[int]) -> None:
        """``api``: the :class:`~tests.fake_cluster_api.FakeClusterApi` in the process
        ``api_pid``; ``host``: the nodes of :func:`memories`, in the processes
        ``host_pids``."""
        self.s = scenario
        self.api = api
        self._api_pid = api_pid
        self.root = root
        self.report = Report()
        self._random = random.Random(scenario.seed)
        self.host = host
        self._host_pids = host_pids
        self.nodes = memories(scenario)
        self.extenders = [self._extender(i) for i in range(2)]
        self._turn = 0
        self._lock = threading.Lock()
        self._queue: deque[dict[str, Any]] = deque()
        self._unschedulable: list[dict[str, Any]] = []
        self._running: dict[str, _Running] = {}
        self._in_flight = 0
        self._bind_slots = threading.BoundedSemaphore(BINDS_IN_FLIGHT)
        self._starts = ThreadPoolExecutor(max_workers=STARTS_AT_ONCE)
        self._node_names = msgspec.json.encode(list(self.nodes))

    def _extender(self, index: int) -> ExtenderProcess:
        return ExtenderProcess(self.root / "kubeconfig", self.root / f"extender-{index}.log",
                               strategy=self.s.strategy, max_age=MAX_AGE)

    # --- the run ----------------------------------------------------------------------------

    def run(self) -> Report:
        binds = ThreadPoolExecutor(max_workers=BINDS_IN_FLIGHT)
        started = time.monotonic()
        restarted_extender = restarted_agents = False
        try:
            while self.report.created < self.s.pods:
                burst = min(self.s.burst, self.s.pods - self.report.created)
                for _ in range(burst):
                    self._create()
                self._schedule_until_settled(binds)
                done = self.report.created / self.s.pods
                if not restarted_extender and done >= self.s.restart_extender_at:
                    self._restart_extender(0)
                    restarted_extender = True
                if not restarted_agents and done >= self.s.restart_agents_at:
                    self.host.restart_agents(list(self.nodes)[::10])
                    restarted_agents = True
                self.check()
                self._delete_some()
            self._schedule_until_settled(binds)
            # As kube-scheduler retries its unschedulable pods when the cluster changes: once
            # the agents have pruned the lines of the last pods deleted, once more.
            self._settle_ledgers()
            self._schedule_until_settled(binds)
            self.check()
        finally:
            binds.shutdown(wait=True)
            self._starts.shutdown(wait=True)
        self.report.seconds = time.monotonic() - started
        self.report.errors += self.host.errors()
        self._final_checks()
        return self.report

    def close(self) -> None:
        for extender in self.extenders:
            extender.stop()

    def _restart_extender(self, index: int) -> None:
        self.extenders[index].stop()
        self.extenders[index] = self._extender(index)

    # --- pods -------------------------------------------------------------------------------

    def _create(self) -> None:
        n = self.report.created
        self.report.created += 1
        r = self._random
        name = f"pod-{n:05d}"
        if r.random() < self.s.whole_share:
            pod = pod_object(name, whole=r.choice((1, 1, 2, 4)))
        else:
            cores = r.choice((10, 20, 25, 30, 50))
            memory = r.choice((1, 2, 4, 8, 10, 16, 20, 40))
            several = self.s.gpus_per_node > 1 and r.random() < 0.1  # tensor-parallel pods
            pod = pod_object(name, cores=cores, memory_gib=memory,
                             whole=1 if r.random() < 0.02 else 0, gpus=2 if several else 1)
        self.api.add_pod(pod)
        self._queue.append(pod)

    def _delete_some(self) -> None:
        with self._lock:
            uids = list(self._running)
        victims = self._random.sample(uids, k=min(len(uids),
                                                  int(self.s.burst * self.s.delete_ratio)))
        for uid in victims:
            with self._lock:
                gone = self._running.pop(uid)
            metadata = gone.pod["metadata"]
            self.api.remove(f"/api/v1/namespaces/{metadata['namespace']}/pods/"
                            f"{metadata['name']}")
            self.host.remove_pod(gone.node, metadata["namespace"], metadata["name"])
            self.report.deleted += 1
        with self._lock:  # room came back: the scheduler tries its unschedulable pods again
            self._queue.extend(self._unschedulable)
            self._unschedulable.clear()

    # --- the scheduler ----------------------------------------------------------------------

    def _schedule_until_settled(self, binds: ThreadPoolExecutor) -> None:
        """Schedule until the queue is empty and no bind is in flight; pods left unschedulable
        get two more tries, one agent pass apart (pruned ledgers may have freed room)."""
        idle_rounds = 0
        while True:
            began, before, cpu = time.monotonic(), self.report.started, self._cpu()
            self._drain(binds)
            self.report.placing_seconds += time.monotonic() - began
            for part, seconds in self._cpu().items():
                self.report.placing_cpu[part] += seconds - cpu[part]
            with self._lock:
                waiting = bool(self._unschedulable)
            if not waiting:
                return
            idle_rounds = 0 if self.report.started > before else idle_rounds + 1
            if idle_rounds > 2:
                return
            time.sleep(self.s.agent_every)
            with self._lock:
                self._queue.extend(self._unschedulable)
                self._unschedulable.clear()

    def _drain(self, binds: ThreadPoolExecutor) -> None:
        while True:
            with self._lock:
                pod = self._queue.popleft() if self._queue else None
                in_flight = self._in_flight
            if pod is not None:
                self._cycle(pod, binds)
            elif in_flight:
                time.sleep(0.002)
            else:
                return

    def _cycle(self, pod: dict[str, Any], binds: ThreadPoolExecutor) -> None:
        began = time.perf_counter()
        try:
            self._schedule(pod, binds)
        finally:
            self.report.cycle_seconds["cycle"] += time.perf_counter() - began

    def _schedule(self, pod: dict[str, Any], binds: ThreadPoolExecutor) -> None:
        extender = self.extenders[self._turn // self.s.leader_cycles % 2]
        self._turn += 1
        waited = self.report.cycle_seconds
        pod_json = msgspec.json.encode(pod)
        sent = time.perf_counter()
        names = _decode_filtered(extender.answer("/filter", _envelope(pod_json,
                                                                      self._node_names)))
        waited["filter"] += time.perf_counter() - sent
        unknown = set(names) - set(self.nodes)
        assert not unknown, f"the extender kept nodes it was not sent: {unknown}"
        if not names:
            with self._lock:
                self._unschedulable.append(pod)
            return
        sent = time.perf_counter()
        scores = _decode_scores(extender.answer("/prioritize", _envelope(
            pod_json, msgspec.json.encode(names))))
        waited["prioritize"] += time.perf_counter() - sent
        best = max(s.score for s in scores)
        choice = self._random.choice([s.host for s in scores if s.score == best])
        assert choice in names
        sent = time.perf_counter()
        self._bind_slots.acquire()
        waited["bind_slot"] += time.perf_counter() - sent
        try:
            answered = extender.sent("/bind", binding_args(pod, choice))
        except Exception as exc:  # the report shows it; the pod is lost
            self._bind_slots.release()
            self.report.errors.append(f"bind {pod['metadata']['name']}: {exc!r}")
            return
        with self._lock:
            self._in_flight += 1
        binds.submit(self._bind, pod, answered, choice)

    def _cpu(self) -> dict[str, float]:
        """CPU seconds used so far by each of PARTS (the extenders: the current two)."""
        pids = {"api": [self._api_pid], "scheduler": [os.getpid()], "nodes": self._host_pids,
                "extenders": [extender.pid for extender in self.extenders]}
        return {part: sum(_cpu_seconds(pid) for pid in pids[part]) for part in PARTS}

    def _bind(self, pod: dict[str, Any], answered: Callable[[], bytes], node: str) -> None:
        try:
            answer = json.loads(answered())
        except Exception as exc:  # the report shows it; the pod is lost
            self.report.errors.append(f"bind {pod['metadata']['name']}: {exc!r}")
            self._settled()
            return
        finally:
            self._bind_slots.release()
        if answer.get("Error"):
            with self._lock:
                self.report.bind_failures += 1
                self.report.bind_errors.append(answer["Error"])
                self._queue.append(pod)
            self._settled()
            return
        # kubelet starts the pod on its node: the scheduler's binding is over.
        self._starts.submit(self._start_settled, pod, node)

    def _start_settled(self, pod: dict[str, Any], node: str) -> None:
        try:
            self._start(pod, node)
        except Exception as exc:  # the report shows it; the pod is lost
            self.report.errors.append(f"start {pod['metadata']['name']}: {exc!r}")
        finally:
            self._settled()

    def _settled(self) -> None:
        """A pod's bind failed, or its start is over."""
        with self._lock:
            self._in_flight -= 1

    # --- the node ---------------------------------------------------------------------------

    def _start(self, pod: dict[str, Any], node: str) -> None:
        metadata = pod["metadata"]
        stored = self.api.get(f"/api/v1/namespaces/{metadata['namespace']}/pods/"
                              f"{metadata['name']}")
        assignment = decode_assignment(stored["metadata"]["annotations"][ASSIGNMENT_ANNOTATION])
        who = f"{metadata['name']} on {node}"
        try:
            started = self.host.start_pod(node, stored)
        except StartError as exc:
            self.report.refused_at_start.append(f"{who}: {exc}")
            return
        for container, got in started.items():
            wanted = _wanted(container, assignment)
            if wanted is not None and sorted(got) != sorted(wanted):
                self.report.wrong_gpu.append(f"{who}/{container}: got {got}, bound to {wanted}")
        with self._lock:
            self._running[metadata["uid"]] = _Running(stored, node, assignment)
            self.report.started += 1
            self.report.started_on_several_gpus += len(assignment.shared_gpus()) > 1

    # --- checks -----------------------------------------------------------------------------

    def check(self) -> None:
        """What the running containers hold: no GPU over-committed, none shared and whole."""
        with self._lock:
            running = list(self._running.values())
        use: dict[str, list[int]] = {}
        whole: dict[str, int] = {}
        size = {gpu.uuid: gpu.memory for name, sizes in self.nodes.items()
                for gpu in gpus(name, sizes)}
        for item in running:
            if item.assignment.shared:
                _, cores, memory = item.assignment.shared
                for uuid in item.assignment.shared_gpus():  # each holds all of the share
                    totals = use.setdefault(uuid, [0, 0])
                    totals[0] += cores
                    totals[1] += memory
            for uuid in item.assignment.whole:
                whole[uuid] = whole.get(uuid, 0) + 1
        for uuid, (cores, memory) in use.items():
            if cores > CORES_PER_GPU or memory > size[uuid]:
                self.report.over_committed.append(f"{uuid}: {cores}% and {memory} bytes")
            if uuid in whole:
                self.report.shared_and_whole.append(uuid)
        self.report.over_committed += [f"{u} given whole {n} times" for u, n in whole.items()
                                       if n > 1]

    def _final_checks(self) -> None:
        views = self._views()
        self.report.never_placed = len(self._queue) + len(self._unschedulable)
        for pod in list(self._queue) + self._unschedulable:
            demand = pod_demand(pod, CORE_KEYS)
            if any(_fits(view, demand) for view in views):
                self.report.unschedulable_but_fit.append(pod["metadata"]["name"])
        blocks = [view.largest_free_block() for view in views]
        self.report.largest_free_gib = sum(blocks) / len(blocks) / GIB if blocks else 0.0
        self.report.idle_gpus = sum(1 for view in views for gpu in view.gpus if gpu.idle)

    def _settle_ledgers(self) -> None:
        """Let every agent prune the lines of pods deleted last (after the ledger's grace)."""
        time.sleep(LEDGER_GRACE + 0.1)
        self.host.pass_all()
        with self._lock:
            self._queue.extend(self._unschedulable)
            self._unschedulable.clear()

    def _views(self) -> list[NodeGpus]:
        views = []
        for name in self.nodes:
            stored = self.api.get(f"/api/v1/nodes/{name}")
            views.append(node_gpus(name, stored["metadata"].get("annotations"), time.time(),
                                   MAX_AGE))
        return views


class _FilterResult(msgspec.Struct):
    """What the scheduler reads of ExtenderFilterResult here: the kept nodes' names."""

    node_names: list[str] | None = msgspec.field(default=None, name="NodeNames")
    error: str = msgspec.field(default="", name="Error")


class _HostPriority(msgspec.Struct, rename="pascal"):
    host: str
    score: int


_decode_filter_result = msgspec.json.Decoder(_FilterResult).decode
_decode_scores = msgspec.json.Decoder(list[_HostPriority]).decode


def _decode_filtered(body: bytes) -> list[str]:
    """The names filter kept (kube-scheduler reads NodeNames when nodeCacheCapable)."""
    result = _decode_filter_result(body)
    assert not result.error, result.error
    return result.node_names or []


def _envelope(pod_json: bytes, names_json: bytes) -> bytes:
    """ExtenderArgs as kube-scheduler sends them with nodeCacheCapable: true."""
    return b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + names_json + b'}'



def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads, ended ones too)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as source:
        fields = source.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK")


def _wanted(container: str, assignment: Assignment) -> list[str] | None:
    if container == "share":
        return list(assignment.shared_gpus())
    if container == "whole":
        return list(assignment.whole)
    return None


def _fits(view: NodeGpus, demand: Demand) -> bool:
    try:
        place(view, demand)
    except Unfit:
        return False
    return True


def memories(scenario: Scenario) -> dict[str, list[int]]:
    """The nodes' names and their GPUs' sizes: half the nodes of each size."""
    return {f"gpu-{index:03d}": [scenario.gpu_sizes[index % 2]] * scenario.gpus_per_node
            for index in range(scenario.nodes)}


def run(scenario: Scenario) -> Report:
    """Run ``scenario`` in a scratch folder and return its report."""
    with tempfile.TemporaryDirectory(prefix="vcuda-placement-sim-") as scratch:
        root = Path(scratch)
        with api_process.started(root) as (api, api_pid):
            kubeconfig = root / "kubeconfig"
            kubeconfig.write_text(api.kubeconfig())
            for name in memories(scenario):
                register(api, name)
            with nodes.started(root, kubeconfig, memories(scenario), LEDGER_GRACE,
                               scenario.agent_every, scenario.node_processes) as (host, host_pids):
                simulation = Simulation(scenario, api, api_pid, root, host, host_pids)
                try:
                    return simulation.run()
                finally:
                    simulation.close()
