"""``vcuda-node run``: keeps the GPU inventory and node resources current, and serves metrics."""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from runtime_hook.contract import INVENTORY_NAME, Gpu, Sharing
from runtime_hook.node.host_root import host_path
from runtime_hook.node.logs import Problems, event
from runtime_hook.node.metrics import NodeCollector, serve
from runtime_hook.node.nvml import Nvml, NvmlError
from runtime_hook.node.observe import Observer

if TYPE_CHECKING:  # the agent loads them (and kubernetes, grpc) only to advertise, to place
    from runtime_hook.node.advertise import NodeStatus
    from runtime_hook.node.dra.driver import DraSettings, Driver
    from runtime_hook.node.kube_events import EventRecorder
    from runtime_hook.node.placement_agent import Placement
# Where kubelet and the runtime meet vcuda's device plugin, on the node (under --host-root).
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
POD_RESOURCES = "/var/lib/kubelet/pod-resources/kubelet.sock"


class Settings(NamedTuple):
    """The command line of ``vcuda-node run``; ``dra`` None when the agent is no DRA driver."""

    host_root: str
    state_dir: str
    node: str
    domains: tuple[str, ...]
    sharing: Sharing
    address: str
    port: int
    interval: float
    run_dirs: list[str]
    advertise: bool
    kubeconfig: str | None
    placement: bool = False
    dra: DraSettings | None = None


class Advertiser:
    """One pass of keeping the inventory file and the node's extended resources in step with NVML.

    ``status`` is the node's, or None to write the inventory alone; ``driver`` the DRA
    driver whose ResourceSlice follows the GPUs too, or None; ``events`` records on the Node
    what an operator should see (None: no Events).
    """

    def __init__(
        self, nvml: Nvml, settings: Settings, status: NodeStatus | None, log: logging.Logger,
        driver: Driver | None = None, events: EventRecorder | None = None,
    ) -> None:
        self._nvml = nvml
        self._settings = settings
        self._status = status
        self._driver = driver
        self._events = events
        self._log = log
        self._refused: int | None = None  # the hook's count of refused starts, last read
        self.problems = Problems(log, "advertise")
        state = host_path(settings.host_root, settings.state_dir)
        self.inventory = os.path.join(state, INVENTORY_NAME)

    def once(self) -> list[Gpu] | None:
        """Read the GPUs; rewrite the inventory and patch the node where they changed.

        Return the GPUs found, None when NVML could not be read.
        """
        gpus = None
        try:
            found = self._nvml.gpus(self.problems)
            migs = self._nvml.mig_devices(found, self.problems)
        except NvmlError as exc:  # keep what was advertised: the driver may be restarting
            self.problems.report("nvml", "NVML", str(exc))
            if self._events is not None:
                from runtime_hook.node.kube_events import WARNING

                self._events.node_event(WARNING, "NVMLUnavailable", "ReadGPUs",
                                        f"{exc}; the node keeps its last GPUs advertised")
        else:
            gpus = [Gpu(g.uuid, g.index, g.memory_total) for g in found]
            self._write_inventory(gpus + migs)  # the hook checks MIG devices too
            if self._status is not None:
                self._advertise(self._status, gpus)
            if self._driver is not None:
                self._driver.publish(self._nvml, gpus, self.problems)
        self._note_refusals()
        if self._events is not None:
            self._events.flush()
        self.problems.cycle_done()
        return gpus

    def _note_refusals(self) -> None:
        """One Warning on the Node for the starts the hook refused since the last pass (the
        first pass only reads the count: what came before was told by the agent then)."""
        from runtime_hook.node.workloads import refused_starts

        if self._events is None:
            return
        count = refused_starts(self._settings.host_root, self._settings.state_dir,
                               self.problems)
        if count is None:
            return
        if self._refused is not None and count > self._refused:
            from runtime_hook.node.kube_events import WARNING

            self._events.node_event(
                WARNING, "ContainerStartRefused", "RefuseStart",
                "the vcuda hook refused to start a limited container on this node; the "
                "pod's own events (kubectl describe pod) say which and why",
                occurrences=count - self._refused)
        self._refused = count

    def _write_inventory(self, gpus: list[Gpu]) -> None:
        from runtime_hook.node.advertise import update_inventory

        try:
            if update_inventory(self.inventory, gpus):
                event(self._log, logging.INFO, "inventory_written", path=self.inventory,
                      gpus=[g._asdict() for g in gpus])
                if self._events is not None:
                    from runtime_hook.node.kube_events import NORMAL, inventory_note

                    self._events.node_event(NORMAL, "GPUInventoryChanged", "WriteInventory",
                                            inventory_note(gpus))
        except OSError as exc:
            self.problems.report("inventory", self.inventory, f"cannot write: {exc}")

    def _advertise(self, status: NodeStatus, gpus: list[Gpu]) -> None:
        from runtime_hook.node.advertise import (
            AdvertiseError,
            largest_share_change,
            resources,
            status_patch,
        )

        settings = self._settings
        wanted = resources(gpus, settings.domains, settings.sharing)
        try:
            node = status.read()
            operations = status_patch(node, wanted)
            if operations:
                status.patch(operations)
                event(self._log, logging.INFO, "advertised", node=settings.node, resources=wanted)
            largest = largest_share_change(node, gpus, settings.sharing.memory_scaling)
            if largest is not None:
                status.annotate(largest)
                event(self._log, logging.INFO, "largest_share_published", node=settings.node,
                      annotations=largest)
        except AdvertiseError as exc:
            self.problems.report("advertise", f"node {settings.node}", str(exc))


def run(settings: Settings, log: logging.Logger, stop: threading.Event,
        nvml: Nvml | None = None) -> None:
    """Serve metrics and advertise every ``settings.interval`` seconds until ``stop`` is set.

    ``nvml`` defaults to the ``pynvml`` library's.
    """
    status: NodeStatus | None = None
    driver: Driver | None = None
    client: Any = None  # the Kubernetes client the Events go through (None: no Kubernetes)
    if settings.advertise and settings.dra is None:
        from runtime_hook.node.advertise import NodeStatus

        status = NodeStatus(settings.node, settings.kubeconfig)
        client = status.client
    if settings.dra is not None:  # the GPUs go to ResourceSlices instead of the node's status
        from runtime_hook.node.dra import driver as dra
        from runtime_hook.node.dra.kube import DraApi

        dra_api = DraApi(settings.kubeconfig)
        client = dra_api.client
        driver = dra.Driver(settings.dra, settings.node, settings.host_root, settings.state_dir,
                            settings.sharing, dra_api, log)
    nvml = nvml or Nvml(host_root=settings.host_root)
    observer = Observer(nvml, Problems(log, "metrics"), settings.host_root, settings.state_dir,
                        tuple(settings.run_dirs))
    collector = NodeCollector(observer, settings.node, observer.problems,
                              driver.claim_stats if driver is not None else None)
    server, thread = serve(collector, settings.address, settings.port)
    event(log, logging.INFO, "serving", address=settings.address, port=server.server_port,
          node=settings.node, advertise=settings.advertise)
    advertiser = Advertiser(nvml, settings, status, log, driver,
                            None if client is None else _recorder(client, settings.node, log))
    placement = _placement(settings, status, log) \
        if settings.placement and status is not None else None
    if placement is not None:
        placement.watch_ended_pods()
    if driver is not None:
        driver.start()
    try:
        while not stop.is_set():
            gpus = advertiser.once()
            if placement is not None:
                placement.once(None if gpus is None else published(gpus, settings.sharing))
            stop.wait(settings.interval)
    finally:
        if placement is not None:
            placement.stop()
        if driver is not None:
            driver.stop()
        server.shutdown()
        server.server_close()
        thread.join()
        nvml.close()
        event(log, logging.INFO, "stopped")


def published(gpus: list[Gpu], sharing: Sharing) -> list[Gpu]:
    """``gpus`` as placement sees them: what each gives out to shared containers."""
    return [Gpu(g.uuid, g.index, sharing.memory(g.memory), sharing.cores(), sharing.max_sharers)
            for g in gpus]


def _recorder(client: Any, node: str, log: logging.Logger) -> EventRecorder:
    from runtime_hook.node.kube_events import EventRecorder

    return EventRecorder(client, node, log)


def _placement(settings: Settings, status: NodeStatus, log: logging.Logger) -> Placement:
    from runtime_hook.contract import resource_names
    from runtime_hook.node import cdi_files
    from runtime_hook.node.placement_agent import Paths, Placement

    def on_host(path: str) -> str:
        return host_path(settings.host_root, path)

    paths = Paths(on_host(PLUGIN_DIR), on_host(cdi_files.DEFAULT_DIR), on_host(POD_RESOURCES))
    core_keys = tuple(resource_names(domain)[0] for domain in settings.domains)
    return Placement(status, paths, core_keys, log)
