"""vcuda as a DRA driver on one node: the kubelet plugin and the node's ResourceSlice together."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

from runtime_hook.contract import Gpu, Sharing
from runtime_hook.node.dra.kube import DraApi, DraApiError
from runtime_hook.node.dra.plugin import KubeletPlugin, with_fix
from runtime_hook.node.dra.prepare import Paths, Preparer
from runtime_hook.node.dra.publish import publish
from runtime_hook.node.dra.slices import GpuModel
from runtime_hook.node.logs import Problems, event
from runtime_hook.node.nvml import Nvml, NvmlError
from runtime_hook.record import Record


class DraSettings(Record):
    """The DRA options of ``vcuda-node run``: node paths of kubelet's directory, the CDI
    directory, libvcuda.so; the CDI kind of NVIDIA's GPUs; the account tmpfs size."""

    _fields = ("kubelet_dir", "cdi_dir", "library", "gpu_cdi_kind", "account_mib")
    __slots__ = _fields
    kubelet_dir: str
    cdi_dir: str
    library: str
    gpu_cdi_kind: str
    account_mib: int


class ClaimStats(Record):
    """The plugin's claims for the agent's metrics: ``prepared`` on each GPU (by UUID), and
    ``failed`` calls of kubelet (by call: prepare, unprepare) since the agent started."""

    _fields = ("prepared", "failed")
    __slots__ = _fields
    prepared: Mapping[str, int]
    failed: Mapping[str, int]


class Driver:
    """Serves kubelet and publishes the slice of ``node`` (its pool has the node's name).

    Kubelet deletes every ResourceSlice of its node when it starts, and a driver's slices
    when its plugin stays away: each time kubelet registers the plugin, the slice last
    published is published again at once rather than at the agent's next pass.
    """

    def __init__(self, settings: DraSettings, node: str, host_root: str, state_dir: str,
                 sharing: Sharing, api: DraApi, log: logging.Logger) -> None:
        self._node = node
        self._sharing = sharing
        self._api = api
        self._log = log
        self._node_uid: str | None = None  # read once: the Node owns the slice
        self._models: list[GpuModel] | None = None  # what the slice offers; None: not yet
        self._publishing = threading.Lock()  # the agent's pass and kubelet's registration
        paths = Paths(host_root=host_root, state_dir=state_dir, cdi_dir=settings.cdi_dir,
                      library=settings.library, account_mib=settings.account_mib)
        self._preparer = Preparer(paths, pool=node, sharing=sharing,
                                  gpu_kind=settings.gpu_cdi_kind, log=log)
        self.plugin = KubeletPlugin(self._preparer, api.claim, host_root, settings.kubelet_dir,
                                    log, on_registered=self._republish)

    def claim_stats(self) -> ClaimStats:
        """What the plugin prepared, per GPU, and what failed; read at each scrape."""
        return ClaimStats(self._preparer.prepared(), self.plugin.failures())

    def start(self) -> None:
        """Start serving kubelet."""
        self.plugin.start()

    def stop(self) -> None:
        """Stop serving kubelet (the slice stays: kubelet removes it if the plugin stays away)."""
        self.plugin.stop()

    def publish(self, nvml: Nvml, gpus: Iterable[Gpu], problems: Problems) -> None:
        """Make the node's slice offer ``gpus`` (described through ``nvml``)."""
        models = []
        for gpu in gpus:
            try:
                product, capability = nvml.model(gpu.index)
            except NvmlError as exc:
                problems.report("nvml", f"GPU {gpu.index}", str(exc))
                continue
            models.append(GpuModel(gpu.uuid, gpu.index, gpu.memory, product, capability))
        try:
            self._publish(models)
        except DraApiError as exc:
            problems.report("resourceslice", f"node {self._node}", with_fix(exc))

    def _republish(self) -> None:
        """Publish the slice of the last pass again (kubelet may have deleted it); failures
        are logged, and the next pass tries again."""
        if self._models is None:
            return  # the agent's first pass publishes
        try:
            self._publish(self._models)
        except DraApiError as exc:
            event(self._log, logging.WARNING, "resourceslice_failed", node=self._node,
                  error=with_fix(exc))

    def _publish(self, models: list[GpuModel]) -> None:
        with self._publishing:
            self._models = models
            if self._node_uid is None:
                self._node_uid = self._api.node_uid(self._node)
            done = publish(self._api, self._node, models, self._sharing, self._node_uid)
        if done:
            event(self._log, logging.INFO, f"resourceslice_{done}", node=self._node,
                  devices=len(models))
