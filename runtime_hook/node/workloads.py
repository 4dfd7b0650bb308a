"""What runs under the shim here: limited containers (the hook's ledger) and vcuda-run commands.

A container comes from its ledger record; its account is the file the shim
creates in the record's ``account/`` tmpfs. A standalone command comes from
the private directory ``vcuda-run`` keeps under its ``$TMPDIR`` while the
command runs (its ``owner`` and ``limits``), when :mod:`runtime_hook.node.run_dirs`
finds that vcuda-run made it for that command. Either is reported only while
its first process lives: a container that ended, or a record left by one
that died, disappears at once.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from runtime_hook import ledger
from runtime_hook.contract import ACCOUNT_PATH, RUN_DIR_PREFIX, LimitsFormatError, parse_limits
from runtime_hook.node import run_dirs
from runtime_hook.node.host_root import host_path
from runtime_hook.node.logs import Problems
from runtime_hook.node_state import ACCOUNT_DIR, StateDir, process_start_time

_ACCOUNT_NAME = os.path.basename(ACCOUNT_PATH)


class Workload(NamedTuple):
    """One container, or one vcuda-run command, held to limits by the shim.

    Its labels (``namespace``, ``pod``, ``container``; a command has only
    ``container``, ``vcuda-run-<pid>``), ``memory`` in bytes and ``cores`` in
    percent on each of ``devices`` (UUIDs; empty: whatever it uses), the host
    path of its ``account``, its first process (``pid``, ``start_time``), and for a
    command the ``user`` (uid) that runs it.
    """

    namespace: str
    pod: str
    container: str
    memory: int
    cores: int
    devices: tuple[str, ...]
    account: str
    pid: int
    start_time: int
    user: int | None = None  # a command's: the uid that runs it; a container's: None


def containers(host_root: str, state_dir: str, proc: str, problems: Problems) -> list[Workload]:
    """The running limited containers of the ledger in ``state_dir`` (a path on the host);
    ``proc`` is the host's /proc, as this process sees it."""
    state = StateDir(_on_host(host_root, state_dir))
    try:
        names = {n for n in os.listdir(state.containers) if not n.startswith(".")}
    except FileNotFoundError:
        return []  # no limited container ever started here
    found = []
    for entry in ledger.entries(state):
        names.discard(entry.container_id)
        if process_start_time(entry.pid, proc) != entry.start_time:
            continue  # ended; its poststop (or the next prestart) releases the record
        record = state.container_dir(entry.container_id)
        found.append(
            Workload(
                namespace=entry.namespace,
                pod=entry.pod,
                container=entry.container,
                memory=entry.memory,
                cores=entry.cores,
                devices=entry.devices,
                account=os.path.join(record, ACCOUNT_DIR, _ACCOUNT_NAME),
                pid=entry.pid,
                start_time=entry.start_time,
            )
        )
    for name in sorted(names):  # listed, yet ledger.entries could not read them
        problems.report("ledger", f"ledger record {name}", "unreadable: damaged, or being removed")
    return found


def commands(host_root: str, directories: list[str], proc: str,
             problems: Problems) -> list[Workload]:
    """The running vcuda-run commands whose private directories are in ``directories``;
    ``proc`` is the host's /proc, as this process sees it."""
    found = []
    accounts: set[tuple[str, int | None]] = set()
    for directory in directories:
        base = _on_host(host_root, directory)
        try:
            names = sorted(n for n in os.listdir(base) if n.startswith(RUN_DIR_PREFIX))
        except OSError as exc:
            problems.report("vcuda-run", base, f"cannot list: {exc.strerror}")
            continue
        for name in names:
            path = os.path.join(base, name)
            try:
                workload = _command(host_root, path, proc)
            except ValueError as exc:
                problems.report("vcuda-run", path, str(exc))
                continue
            # Commands of one user given one --account share it: report it once.
            if workload is not None and (workload.account, workload.user) not in accounts:
                accounts.add((workload.account, workload.user))
                found.append(workload)
    return found


def _command(host_root: str, path: str, proc: str) -> Workload | None:
    made = run_dirs.read(path, proc)
    if made is None:
        return None
    try:
        limits = parse_limits(made.limits.decode("utf-8"))
    except (LimitsFormatError, UnicodeDecodeError) as exc:
        raise ValueError(f"limits file: {exc}") from None
    if not limits.account:
        raise ValueError("limits file names no account")
    return Workload(
        namespace="",
        pod="",
        container=f"vcuda-run-{made.pid}",
        memory=limits.memory,
        cores=limits.cores,
        devices=limits.devices,
        account=_on_host(host_root, limits.account),
        pid=made.pid,
        start_time=made.start_time,
        user=made.user,
    )


def refused_starts(host_root: str, state_dir: str, problems: Problems) -> int | None:
    """How many starts the hook refused on this node, as its state dir counts them (None:
    unreadable, reported to ``problems``)."""
    state = StateDir(_on_host(host_root, state_dir))
    try:
        return state.refused_starts()
    except OSError as exc:
        problems.report("ledger", state.refusals, f"unreadable: {exc.strerror}")
        return None


def _on_host(host_root: str, path: str) -> str:
    """``path`` of the host, as this process sees it under ``host_root``."""
    return host_path(host_root, path)
