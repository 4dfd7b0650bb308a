"""Preparing and unpreparing claims on this node: the node ledger, the limits file, the CDI spec.

A prepared claim is a record of the node ledger like a limited container's
(``containers/claim-<uid>/`` in the hook's state dir, owner pid 0), so the
hook and the plugin see each other's commitments and the same check refuses
what does not fit, with the same message. Its files are those the hook gives
a container (the limits file, the preload list, the account tmpfs), and the
claim's CDI spec mounts them into every container that uses the claim.

Both directions are idempotent and safe to repeat after a crash at any point:
prepare finishes a record that is half-done (no account mount yet) by
building it again, and rewrites the CDI spec; unprepare removes the spec,
then the record, and succeeds when there is nothing left to remove.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Mapping
from typing import Any

from runtime_hook import contract, inject, ledger
from runtime_hook.apply_limits import write_record_files
from runtime_hook.hook_errors import NodeError
from runtime_hook.limits_decision import Request, overcommit
from runtime_hook.node import cdi_files
from runtime_hook.node.dra import cdi
from runtime_hook.node.dra.allocation import Share, claim_name, shares
from runtime_hook.node.dra.share_config import virtual_memory_asked
from runtime_hook.node.dra.slices import device_name, memory_capacity
from runtime_hook.node.host_root import host_path
from runtime_hook.node.logs import event
from runtime_hook.node_state import ACCOUNT_DIR, CLAIM_OWNER_PID, StateDir
from runtime_hook.record import Record

LOCK_TIMEOUT = 5.0
RECORD_PREFIX = "claim-"
_FIX_OVERCOMMIT = (
    "the scheduler's view and the node differ (a container started by the hook holds that "
    "GPU): delete the pod so that it is placed again"
)


class PrepareError(NodeError, RuntimeError):
    """A claim cannot be prepared or unprepared; the message and ``fix`` are what kubelet
    reports."""


class Prepared(Record):
    """One device of a prepared claim as kubelet wants it back."""

    _fields = ("requests", "pool", "device", "cdi_ids")
    __slots__ = _fields
    requests: list[str]
    pool: str
    device: str
    cdi_ids: list[str]


class Paths(Record):
    """Where things are: ``host_root`` (the node's root as mounted here), and node paths of
    the hook's ``state_dir``, the ``cdi_dir``, the ``library``; ``account_mib`` per claim."""

    _fields = ("host_root", "state_dir", "cdi_dir", "library", "account_mib")
    __slots__ = _fields
    host_root: str
    state_dir: str
    cdi_dir: str
    library: str
    account_mib: int


class Preparer:
    """Prepares claims allocated from ``pool`` (this node's), under the node's ``sharing``."""

    def __init__(self, paths: Paths, pool: str, sharing: contract.Sharing,
                 gpu_kind: str = cdi.NVIDIA_KIND,
                 log: logging.Logger | None = None) -> None:
        self._log = log or logging.getLogger("vcuda-node")
        self._paths = paths
        self._pool = pool
        self._sharing = sharing
        self._gpu_kind = gpu_kind
        self._state = StateDir(host_path(paths.host_root, paths.state_dir))
        self._cdi_dir = host_path(paths.host_root, paths.cdi_dir)

    def prepare(self, uid: str, claim: Mapping[str, Any]) -> list[Prepared]:
        """Prepare the claim object ``claim`` (its UID must be ``uid``); raise PrepareError."""
        _check_uid(uid)
        metadata = claim.get("metadata") or {}
        if metadata.get("uid") != uid:
            raise PrepareError(f"claim {claim_name(claim)} has UID {metadata.get('uid')!r}, "
                               f"kubelet asked for {uid!r}",
                               "the claim was deleted and created again: delete the pod")
        inventory = self._inventory()
        offered = {device_name(g.uuid): (g.uuid, memory_capacity(g.memory, self._sharing))
                   for g in inventory.values()}
        found = shares(claim, self._pool, offered, self._sharing.cores())
        if not found:
            return []
        limited = not found[0].whole
        in_host = self._virtual_memory(claim, found) if limited else 0
        # Under the ledger's lock: an unprepare of the same claim sees both or neither.
        with self._state.locked(LOCK_TIMEOUT):
            self._commit(uid, claim, found, inventory, in_host)
            if limited:
                record = StateDir(self._paths.state_dir).container_dir(RECORD_PREFIX + uid)
                cdi_files.write(self._spec_path(uid), cdi.spec(uid, record, self._paths.library))
        prepared = []
        for number, share in enumerate(found):
            ids = [cdi.gpu_id(share.uuid, self._gpu_kind)]
            if limited and number == 0:  # one vcuda device per claim, whatever its GPUs
                ids.append(cdi.device_id(uid))
            prepared.append(Prepared([share.request], self._pool, share.device, ids))
        return prepared

    def unprepare(self, uid: str) -> None:
        """Undo :meth:`prepare` of claim ``uid``; nothing to undo is success too."""
        _check_uid(uid)
        with self._state.locked(LOCK_TIMEOUT):
            cdi_files.remove(self._spec_path(uid))
            self._state.release(RECORD_PREFIX + uid)

    def prepared(self) -> Counter[str]:
        """How many prepared claims hold each GPU (UUID), as the node ledger records them."""
        try:
            records = ledger.entries(self._state)
        except FileNotFoundError:
            return Counter()  # nothing was ever committed on this node
        return Counter(uuid for entry in records
                       if entry.container_id.startswith(RECORD_PREFIX) for uuid in entry.devices)

    # --- the ledger -------------------------------------------------------------------------

    def _virtual_memory(self, claim: Mapping[str, Any], found: list[Share]) -> int:
        """The bytes of each share's memory that may live in host memory: the claim's config
        asks for virtual memory, and this node scales memory (as the hook gives a pod
        annotated vcuda.io/virtual-memory)."""
        if not virtual_memory_asked(claim, [share.request for share in found]):
            return 0
        in_host = self._sharing.virtual_memory(found[0].memory)
        if in_host:
            event(self._log, logging.INFO, "claim_virtual_memory", claim=claim_name(claim),
                  memory=found[0].memory, in_host_at_most=in_host)
        else:
            event(self._log, logging.WARNING, "claim_virtual_memory_refused",
                  claim=claim_name(claim),
                  reason="the claim asks for virtual memory, but this node does not scale "
                         "memory (--memory-scaling 1): all of its memory is device memory")
        return in_host

    def _commit(self, uid: str, claim: Mapping[str, Any], found: list[Share],
                inventory: Mapping[str, contract.Gpu], in_host: int) -> None:
        """Make the claim's ledger record complete: found as it is, or committed now (hold
        the lock)."""
        first = found[0]
        entry = ledger.Entry(
            container_id=RECORD_PREFIX + uid,
            namespace=(claim.get("metadata") or {}).get("namespace", ""),
            pod="",
            container=f"resourceclaim/{(claim.get('metadata') or {}).get('name', '')}",
            pid=CLAIM_OWNER_PID,
            start_time=0,
            memory=first.memory,
            cores=first.cores,
            devices=tuple(s.uuid for s in found),
        )
        record = self._state.container_dir(entry.container_id)
        existing = next((e for e in ledger.entries(self._state)
                         if e.container_id == entry.container_id), None)
        if existing is not None and os.path.ismount(os.path.join(record, ACCOUNT_DIR)):
            if existing != entry:
                raise PrepareError(f"claim {claim_name(claim)} was prepared here with "
                                   f"another allocation ({existing.devices})",
                                   "delete the pod and its claim")
            return  # prepared before: kubelet asks again after a restart
        self._state.release(entry.container_id)  # half-built by a prepare that crashed
        self._state.release_gone()
        records = ledger.entries(self._state)
        request = Request(container=entry.container, cores=entry.cores, memory=entry.memory)
        reason = overcommit(request, entry.devices, ledger.committed(records), inventory,
                            self._sharing, ledger.sharers(records))
        if reason:
            raise PrepareError(f"claim {claim_name(claim)}: {reason}", _FIX_OVERCOMMIT)
        ledger.commit(self._state, entry)
        try:
            self._fill(record, entry, in_host)
        except BaseException:
            self._state.release(entry.container_id)
            raise

    def _fill(self, record: str, entry: ledger.Entry, in_host: int) -> None:
        limits = contract.Limits(memory=entry.memory, cores=entry.cores, devices=entry.devices,
                                 account=contract.ACCOUNT_PATH, virtual_memory=in_host)
        write_record_files(record, contract.render_limits(limits), self._paths.account_mib,
                           preload=inject.merge_preload(b"").decode())

    # --- paths ------------------------------------------------------------------------------

    def _inventory(self) -> dict[str, contract.Gpu]:
        path = os.path.join(self._state.path, contract.INVENTORY_NAME)
        try:
            inventory = contract.read_inventory(path)
        except contract.InventoryError as exc:
            raise PrepareError(f"the GPU inventory is unusable: {exc}", exc.fix) from None
        if inventory is None:
            raise PrepareError(f"no GPU inventory at {path} yet",
                               "wait: the node agent writes it once NVML answers")
        return inventory

    def _spec_path(self, uid: str) -> str:
        return cdi.spec_path(self._cdi_dir, uid)


_UID_CHARS = frozenset("0123456789abcdefABCDEF-")


def _check_uid(uid: str) -> None:
    """A claim's UID names files: refuse anything but a UUID's characters."""
    if not 0 < len(uid) <= 64 or not set(uid) <= _UID_CHARS:
        raise PrepareError(f"claim UID {uid!r} is not a UUID", "only kubelet may call the plugin")
