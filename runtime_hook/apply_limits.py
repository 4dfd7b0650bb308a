"""Applying a container's limits: commit its GPU memory and time in the ledger, install the shim."""

from __future__ import annotations

import os

from runtime_hook import confinement, device_assignment, inject, ledger, syscalls
from runtime_hook.contract import ACCOUNT_PATH, Limits, read_inventory, render_limits
from runtime_hook.device_assignment import Devices
from runtime_hook.hook_cli import LOCK_TIMEOUT, Flags
from runtime_hook.hook_errors import HookError
from runtime_hook.hook_log import HookLog
from runtime_hook.limits_decision import Request, overcommit, pod_of, too_few_gpus
from runtime_hook.node_state import (
    ACCOUNT_DIR,
    LIMITS_FILE,
    PRELOAD_FILE,
    StateDir,
    process_start_time,
)
from runtime_hook.oci_spec import Container

_FIX_CONFINEMENT = (
    "give the container seccompProfile RuntimeDefault (vcuda's webhook sets it) and no "
    "CAP_SYS_ADMIN; see the README's threat model"
)
_FIX_GPU_COUNT = (
    "place pods with vcuda-gpus above 1 through vcuda's scheduler extender and device plugin "
    "(vcuda.io/shared-gpu) or DRA: time-slicing replicas may be copies of one GPU"
)
_FIX_OVERCOMMIT = (
    "lower the container's vcuda-memory or vcuda-core, or start it once other containers "
    "on that GPU stop"
)


def apply(container: Container, request: Request, flags: Flags, log: HookLog) -> None:
    """Commit ``request`` on this node's GPUs and mount the shim's files into ``container``."""
    escape = confinement.escape_left_open(container.seccomp, container.capabilities)
    if escape:
        raise HookError(f"the container is limited, but {escape}", _FIX_CONFINEMENT)
    inventory = read_inventory(flags.inventory)
    if inventory is None:
        log.warning(f"no GPU inventory at {flags.inventory}: GPU memory is not checked")
    devices = device_assignment.assigned(container, inventory)
    for note in devices.notes:
        log.warning(note)
    short = too_few_gpus(request, devices.for_ledger)
    if short:
        raise HookError(short, _FIX_GPU_COUNT)
    virtual = flags.sharing.virtual_memory(request.memory) if request.virtual else 0
    if request.virtual and not virtual:
        log.info("the pod asks for virtual memory, but this node does not scale memory "
                 "(--memory-scaling 1): all of its limit is device memory")
    limits = Limits(
        memory=request.memory,
        cores=request.cores,
        devices=devices.for_limits,
        account=ACCOUNT_PATH,
        virtual_memory=virtual,
    )
    if not os.path.isfile(flags.library):
        raise HookError(
            f"the vcuda library {flags.library} is missing on this node",
            "install the node files, or point --library at libvcuda.so",
        )
    start_time = process_start_time(container.pid) if container.pid else None
    if start_time is None:
        raise HookError(f"the container's process {container.pid} is gone", "start it again")
    state = StateDir(flags.state_dir)
    entry = _entry(container, request, start_time, devices)
    with state.locked(LOCK_TIMEOUT):
        gone = state.release_gone()
        if gone:
            log.info(f"released containers that are gone: {', '.join(gone)}")
        if inventory is not None:
            records = ledger.entries(state)
            reason = overcommit(
                request,
                devices.for_ledger,
                ledger.committed(records),
                inventory,
                flags.sharing,
                ledger.sharers(records),
            )
            if reason:
                raise HookError(reason, _FIX_OVERCOMMIT)
        try:
            record = ledger.commit(state, entry)
        except ledger.DuplicateError as exc:
            raise HookError(str(exc), "the runtime started one container id twice") from None
    try:
        write_record_files(record, render_limits(limits), flags.account_mib)
        sources = inject.Sources(
            library=flags.library,
            limits=os.path.join(record, LIMITS_FILE),
            preload=os.path.join(record, PRELOAD_FILE),
            account_dir=os.path.join(record, ACCOUNT_DIR),
        )
        inject.install(container.pid, container.rootfs, sources, container.readonly)
    except BaseException:
        with state.locked(LOCK_TIMEOUT):
            state.release(container.id)
        raise
    log.info(
        f"applied cores={request.cores} memory={request.memory} gpus={request.gpus} "
        + (f"of which in host memory at most {virtual} " if virtual else "")
        + f"devices={','.join(devices.for_ledger) or '-'}"
    )


def _entry(
    container: Container, request: Request, start_time: int, devices: Devices
) -> ledger.Entry:
    namespace, pod = pod_of(container.annotations)
    return ledger.Entry(
        container_id=container.id,
        namespace=namespace,
        pod=pod,
        container=request.container,
        pid=container.pid,
        start_time=start_time,
        memory=request.memory,
        cores=request.cores,
        devices=devices.for_ledger,
    )


def write_record_files(record: str, limits_text: str, account_mib: int, preload: str = "") -> None:
    """Write a ledger record's limits and preload files and mount its account tmpfs.

    The hook leaves ``preload`` empty and fills it once it has read the image's own list.
    """
    for name, content in ((LIMITS_FILE, limits_text), (PRELOAD_FILE, preload)):
        with open(os.path.join(record, name), "x", encoding="utf-8") as out:
            out.write(content)
        os.chmod(os.path.join(record, name), 0o644)
    # A tmpfs of its own, so that a container can fill this and not the host's
    # /run. Mode 1777: any user of the container may create the account (the
    # shim runs as whatever user the image uses); the sticky bit stops one user
    # from deleting or renaming another's files.
    syscalls.mount(
        "tmpfs",
        os.path.join(record, ACCOUNT_DIR),
        "tmpfs",
        syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC,
        f"size={account_mib}m,nr_inodes=1024,mode=1777",
    )
