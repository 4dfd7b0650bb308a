"""The node side of per-GPU placement, one pass at a time: publish the GPUs with a heartbeat,
serve the device plugins, retire the slots of containers that are gone, and prune the ledger
lines of pods that are gone. Between passes, a watch of the node's pods prunes the line of each
pod that ends as it ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from runtime_hook.contract import (
    INVENTORY_ANNOTATION,
    LEDGER_ANNOTATION,
    SHARED_RESOURCE,
    WHOLE_RESOURCE,
    Gpu,
)
from runtime_hook.node.advertise import AdvertiseError, NodeStatus
from runtime_hook.node.bound_gpus import Refusal, container_gpus
from runtime_hook.node.device_plugin import (
    DevicePlugin,
    Served,
    Slots,
    first_generation,
    slots_per_gpu,
)
from runtime_hook.node.ended_pods import ENDED_PHASES, EndedPods
from runtime_hook.node.logs import Problems, event
from runtime_hook.placement import (
    Entry,
    PlacementError,
    decode_ledger,
    encode_inventory,
    encode_ledger,
)

RESOURCES = (SHARED_RESOURCE, WHOLE_RESOURCE)
LEDGER_GRACE = 60.0  # seconds a line may wait for its pod's Binding before it is pruned
PRUNE_BATCH = 0.2  # seconds the ends of a burst of pods are gathered into one ledger write


def ended_lines(ledger: Mapping[str, Entry], pods: list[dict[str, Any]], now: float,
                grace: float) -> list[str]:
    """The pod UIDs of ``ledger`` to prune, given the ``pods`` bound to its node: those whose
    pod ended, and those whose pod is not there although its line is older than ``grace``
    seconds (a line is written just before its Binding)."""
    found = {(p.get("metadata") or {}).get("uid"): p for p in pods}
    return [uid for uid, entry in ledger.items()
            if (uid in found and (found[uid].get("status") or {}).get("phase") in ENDED_PHASES)
            or (uid not in found and now - entry.at > grace)]


class Paths:
    """Where kubelet and the runtime meet the plugin, on the node."""

    def __init__(self, plugin_dir: str, cdi_dir: str, pod_resources: str) -> None:
        self.plugin_dir, self.cdi_dir, self.pod_resources = plugin_dir, cdi_dir, pod_resources


class Placement:
    """Keeps one node's part of placement in step; call :meth:`once` every interval."""

    def __init__(self, status: NodeStatus, paths: Paths, core_keys: tuple[str, ...],
                 log: logging.Logger, clock: Callable[[], float] = time.time,
                 ledger_grace: float = LEDGER_GRACE) -> None:
        """``ledger_grace``: seconds a ledger line may wait for its pod's Binding."""
        self._status = status
        self._ledger_grace = ledger_grace
        self._paths = paths
        self._core_keys = core_keys
        self._log = log
        self._clock = clock
        self.problems = Problems(log, "placement")
        self._pruner_problems = Problems(log, "placement")  # of the pruner's thread
        self._present: set[str] = set()
        self._ledger_lock = threading.Lock()  # one ledger write of this agent at a time
        self._ended_lock = threading.Lock()
        self._ended: set[str] = set()  # UIDs of pods seen to end whose line is not yet pruned
        self._prune_soon = threading.Event()
        self._stopping = threading.Event()
        self._watch = EndedPods(status, status.node, self.pod_ended, log)
        self._pruner = threading.Thread(target=self._prune_ended_loop, name="ledger-pruner",
                                        daemon=True)
        self._channel_lock = threading.Lock()
        self._channel: Any = None
        generation = first_generation()
        self._served = {resource: Served(DevicePlugin(resource, Slots(resource, 0, generation),
                                                      self.resolve, paths.cdi_dir, log),
                                         paths.plugin_dir, log)
                        for resource in RESOURCES}

    def once(self, gpus: list[Gpu] | None) -> None:
        """One pass; ``gpus`` None: NVML could not be read, so no heartbeat this time."""
        if gpus is not None:
            self._present = {gpu.uuid for gpu in gpus}
            self._step("inventory", lambda: self._status.annotate(
                {INVENTORY_ANNOTATION: encode_inventory(gpus, int(self._clock()))}))
            self._step("device plugins", lambda: self._serve(gpus))
        self._step("slots", self._retire_slots)
        self._step("ledger", self._prune_ledger)
        self.problems.cycle_done()

    def watch_ended_pods(self) -> None:
        """Prune the line of each pod of the node as it ends, from now until :meth:`stop`."""
        self._pruner.start()
        self._watch.start()

    def pod_ended(self, uid: str) -> None:
        """Pod ``uid`` of this node ended or is gone: its ledger line goes within a moment."""
        with self._ended_lock:
            self._ended.add(uid)
        self._prune_soon.set()

    def stop(self) -> None:
        self._stopping.set()
        self._prune_soon.set()
        self._watch.stop()
        if self._pruner.ident is not None:  # started
            self._pruner.join(timeout=10)
        for served in self._served.values():
            served.stop()
        self._close_channel()

    def resolve(self, resource: str, ids: list[str]) -> dict[str, str]:
        """The GPU of each device ID, from the pod that kubelet says holds them."""
        holder = self._holder(resource, set(ids))
        if holder is None:
            raise Refusal(f"kubelet's pod resources name no container holding {', '.join(ids)} "
                          f"of {resource}")
        namespace, name, container = holder
        pod = self._status.pod(namespace, name)
        if pod is None:
            raise Refusal(f"pod {namespace}/{name} is gone")
        node = self._status.read()
        try:
            ledger = decode_ledger(((node.get("metadata") or {}).get("annotations") or {})
                                   .get(LEDGER_ANNOTATION))
        except PlacementError as exc:
            raise Refusal(str(exc)) from None
        gpus = container_gpus(pod, ledger, self._status.node, container, resource,
                              self._present, self._core_keys)
        if len(gpus) == 1:
            return dict.fromkeys(ids, gpus[0])
        if len(gpus) != len(ids):
            raise Refusal(f"container {container} of pod {namespace}/{name} holds {len(ids)} "
                          f"{resource} and was bound with {len(gpus)} GPUs")
        return dict(zip(sorted(ids), gpus))

    # --- the steps --------------------------------------------------------------------------

    def _step(self, what: str, step: Callable[[], Any], problems: Problems | None = None) -> None:
        try:
            step()
        except (AdvertiseError, PlacementError, OSError, RuntimeError) as exc:
            (problems or self.problems).report(what, what, str(exc))

    def _serve(self, gpus: list[Gpu]) -> None:
        for resource, served in self._served.items():
            # The node's settings are the same for each of its GPUs: the first tells them.
            per_gpu = slots_per_gpu(resource, gpus[0]) if gpus else 0
            served.plugin.slots.resize(len(gpus), resource, first_generation(), per_gpu)
            if not served.alive():
                served.start()

    def _retire_slots(self) -> None:
        """Slots whose container is gone lose their spec and get a new ID."""
        held = self._held()
        for served in self._served.values():
            plugin = served.plugin
            gone = [device for device in plugin.written() if device not in held]
            for device in gone:
                os.unlink(plugin.spec_path(device))
            plugin.slots.retire(gone)

    def _prune_ledger(self) -> None:
        self._prune(lambda ledger: ended_lines(ledger, self._status.pods(), self._clock(),
                                               self._ledger_grace))

    def _prune_ended_loop(self) -> None:
        while True:
            self._prune_soon.wait()
            if self._stopping.wait(PRUNE_BATCH):
                return
            self._prune_soon.clear()
            self._step("ledger", self._prune_ended, self._pruner_problems)
            self._pruner_problems.cycle_done()

    def _prune_ended(self) -> None:
        with self._ended_lock:
            ended = set(self._ended)
        if not self._prune(lambda ledger: [uid for uid in ledger if uid in ended]):
            self._prune_soon.set()  # the node changed meanwhile: read it again and retry
            return
        with self._ended_lock:
            self._ended -= ended

    def _prune(self, chosen: Callable[[dict[str, Entry]], list[str]]) -> bool:
        """Remove the lines that ``chosen`` picks from the node's ledger; False when the node
        changed between the read and the write (nothing written then)."""
        with self._ledger_lock:
            node = self._status.read()
            metadata = node.get("metadata") or {}
            raw = (metadata.get("annotations") or {}).get(LEDGER_ANNOTATION)
            if raw is None:
                return True
            ledger = decode_ledger(raw)
            gone = chosen(ledger)
            if not gone:
                return True
            kept = {uid: entry for uid, entry in ledger.items() if uid not in gone}
            if not self._status.annotate({LEDGER_ANNOTATION: encode_ledger(kept)},
                                         metadata.get("resourceVersion")):
                return False
            event(self._log, logging.INFO, "ledger_pruned", node=self._status.node,
                  pods=sorted(ledger[uid].pod for uid in gone))
            return True

    # --- kubelet's pod resources ------------------------------------------------------------

    def _pod_resources(self) -> Any:
        """kubelet's List, on one channel kept open (a channel per call costs a connection);
        a failed call is tried once more on a new channel, as one left by a restarted kubelet
        may be waiting out its reconnection backoff."""
        import grpc

        from runtime_hook.node.protos import load

        messages, services = load("podresources")
        retried = False
        while True:
            with self._channel_lock:
                if self._channel is None:
                    self._channel = grpc.insecure_channel(f"unix://{self._paths.pod_resources}")
                channel = self._channel
            try:
                return services.PodResourcesListerStub(channel).List(
                    messages.ListPodResourcesRequest(), timeout=10)
            except grpc.RpcError as exc:
                self._close_channel(channel)
                if retried:
                    raise Refusal(f"kubelet's pod resources API ({self._paths.pod_resources}) "
                                  f"did not answer: {exc.code().name} {exc.details()}") from None
                retried = True

    def _close_channel(self, channel: Any = None) -> None:
        """Close ``channel`` if still the one kept open (None: whichever is open)."""
        with self._channel_lock:
            if self._channel is None or (channel is not None and channel is not self._channel):
                return
            self._channel.close()
            self._channel = None

    def _holder(self, resource: str, ids: set[str]) -> tuple[str, str, str] | None:
        # kubelet lists each device of a container in an entry of its own (one per NUMA node
        # where the plugin gives topology), so a container's devices are gathered first.
        for pod in self._pod_resources().pod_resources:
            for container in pod.containers:
                held = {device for devices in container.devices
                        if devices.resource_name == resource for device in devices.device_ids}
                if ids <= held:
                    return pod.namespace, pod.name, container.name
        return None

    def _held(self) -> set[str]:
        return {device for pod in self._pod_resources().pod_resources
                for container in pod.containers for devices in container.devices
                if devices.resource_name in RESOURCES for device in devices.device_ids}
