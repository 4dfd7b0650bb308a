"""The hook's two stages: prestart commits and applies limits, poststop releases them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from runtime_hook import gpu_inventory, inject, syscalls
from runtime_hook.hook_errors import HookError
from runtime_hook.hook_log import HookLog
from runtime_hook.ledger import (
    ACCOUNT_DIR,
    LIMITS_FILE,
    PRELOAD_FILE,
    Entry,
    Ledger,
    committed_memory,
    process_start_time,
)
from runtime_hook.limits_decision import (
    Request,
    container_name,
    overcommit,
    pod_of,
    requested_limits,
    visible_devices,
)
from runtime_hook.limits_file import Limits, render
from runtime_hook.oci_spec import Container

_FIX_OVERCOMMIT = (
    "lower the container's vcuda-memory, or start it once other containers on that GPU stop"
)


@dataclass(frozen=True)
class Options:
    """The hook's configuration, from its command line."""

    state_dir: str
    library: str
    inventory: str
    memory_scaling: float
    account_mib: int
    lock_timeout: float = 5.0


def prestart(container: Container, options: Options, log: HookLog) -> None:
    """Commit the container's GPU memory on this node and mount the shim's files into it."""
    request = requested_limits(container.annotations)
    if request is None:
        log.debug("no vcuda limits for this container")
        return
    inventory = gpu_inventory.read(options.inventory)
    if inventory is None:
        log.warning(f"no GPU inventory at {options.inventory}: GPU memory is not checked")
    devices = visible_devices(container.env, container.mount_targets, inventory)
    for note in devices.notes:
        log.warning(note)
    limits = Limits(
        memory=request.memory,
        cores=request.cores,
        devices=devices.for_limits,
        account=inject.ACCOUNT_FILE,
    )
    if not os.path.isfile(options.library):
        raise HookError(
            f"the vcuda library {options.library} is missing on this node",
            "install the node files, or point --library at libvcuda.so",
        )
    start_time = process_start_time(container.pid) if container.pid else None
    if start_time is None:
        raise HookError(f"the container's process {container.pid} is gone", "start it again")
    ledger = Ledger(options.state_dir)
    with ledger.locked(options.lock_timeout):
        live, dropped = ledger.reconcile()
        if dropped:
            log.info(f"released containers that are gone: {', '.join(dropped)}")
        if inventory is not None:
            committed = committed_memory(live)
            reason = overcommit(
                request.memory, devices.for_ledger, committed, inventory, options.memory_scaling
            )
            if reason:
                raise HookError(reason, _FIX_OVERCOMMIT)
        record = ledger.commit(_entry(container, request, start_time, devices.for_ledger))
    try:
        _prepare(record, render(limits), options.account_mib)
        sources = inject.Sources(
            library=options.library,
            limits=os.path.join(record, LIMITS_FILE),
            preload=os.path.join(record, PRELOAD_FILE),
            account_dir=os.path.join(record, ACCOUNT_DIR),
        )
        inject.install(container.pid, container.rootfs, sources)
    except BaseException:
        with ledger.locked(options.lock_timeout):
            ledger.release(container.id)
        raise
    log.info(
        f"applied cores={request.cores} memory={request.memory} "
        f"devices={','.join(devices.for_ledger) or '-'}"
    )


def _entry(
    container: Container, request: Request, start_time: int, devices: tuple[str, ...]
) -> Entry:
    namespace, pod = pod_of(container.annotations)
    return Entry(
        container_id=container.id,
        namespace=namespace,
        pod=pod,
        container=container_name(container.annotations),
        pid=container.pid,
        start_time=start_time,
        memory=request.memory,
        cores=request.cores,
        devices=devices,
    )


def _prepare(record: str, limits_text: str, account_mib: int) -> None:
    """Write the container's limits and (empty) preload files and mount its account tmpfs."""
    for name, content in ((LIMITS_FILE, limits_text), (PRELOAD_FILE, "")):
        with open(os.path.join(record, name), "x", encoding="utf-8") as out:
            out.write(content)
        os.chmod(os.path.join(record, name), 0o644)
    # A tmpfs of its own, so a container can fill this and not the host's /run.
    # Mode 1777: any user of the container may create the account (the shim
    # runs as whatever user the image uses); the sticky bit stops one user
    # from deleting or renaming another's files.
    syscalls.mount(
        "tmpfs",
        os.path.join(record, ACCOUNT_DIR),
        "tmpfs",
        syscalls.MS_NOSUID | syscalls.MS_NODEV | syscalls.MS_NOEXEC,
        f"size={account_mib}m,nr_inodes=1024,mode=1777",
    )


def poststop(container: Container, options: Options, log: HookLog) -> None:
    """Release what the container committed and remove its files."""
    ledger = Ledger(options.state_dir)
    if not os.path.lexists(ledger.container_dir(container.id)):
        log.debug("nothing to release")
        return
    with ledger.locked(options.lock_timeout):
        ledger.release(container.id)
    log.info("released")
