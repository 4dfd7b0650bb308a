"""Real processes to observe: a pid namespace standing for a container, ledger records, scrapes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from runtime_hook import ledger
from runtime_hook.contract import RUN_DIR_PREFIX
from runtime_hook.node.http_serving import Limits
from runtime_hook.node.metrics import NodeCollector, serve
from runtime_hook.node.observe import Observer
from runtime_hook.node_state import StateDir, process_start_time
from tests.shim.harness import LIBRARY, REPO

Series = dict[str, dict[frozenset, float]]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as src:
        return sorted(int(word) for word in src.read().split())


@dataclass
class PidNamespace:
    """A first process (pid 1 inside) and sleeping children, in a pid namespace of their own.

    ``host_pids[i]`` is the host's number for the process the namespace numbers ``ns_pids[i]``
    (index 0: the first process).
    """

    unshare: subprocess.Popen[str]
    host_pids: list[int]
    ns_pids: list[int]

    @property
    def init(self) -> int:
        return self.host_pids[0]

    def start_time(self, index: int) -> int:
        start = process_start_time(self.host_pids[index])
        assert start is not None
        return start

    def stop(self) -> None:
        """End the namespace (its first process dies, the kernel kills the rest)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init, signal.SIGKILL)
        self.unshare.wait(timeout=30)


def start_pid_namespace(children: int) -> PidNamespace:
    """Start ``children`` sleeping processes under a first process in a new pid namespace."""
    script = 'i=0; while [ $i -lt "$0" ]; do sleep 600 & echo $!; i=$((i+1)); done; echo up; wait'
    unshare = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script, str(children)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert unshare.stdout is not None
    ns_pids = [1]
    for line in unshare.stdout:
        if line.strip() == "up":
            break
        ns_pids.append(int(line))
    [init] = _children(unshare.pid)
    return PidNamespace(unshare, [init, *_children(init)], ns_pids)


def commit_container(state: Path, container_id: str, owner: int, memory: int, cores: int,
                     devices: tuple[str, ...], namespace: str = "team", pod: str = "train-0",
                     container: str = "worker") -> Path:
    """Record a limited container in the ledger as the hook does; return its account file."""
    state_dir = StateDir(str(state))
    start = process_start_time(owner)
    assert start is not None
    entry = ledger.Entry(container_id=container_id, namespace=namespace, pod=pod,
                         container=container, pid=owner, start_time=start, memory=memory,
                         cores=cores, devices=devices)
    with state_dir.locked(5):
        record = ledger.commit(state_dir, entry)
    return Path(record) / "account" / "account"


class VcudaRun(NamedTuple):
    """A real vcuda-run whose command (``sleep``) runs: the process, its private directory."""

    process: subprocess.Popen[bytes]
    directory: Path

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def start_vcuda_run(tmpdir: Path, *options: str) -> VcudaRun:
    """Run ``vcuda-run OPTIONS -- sleep 600`` with ``$TMPDIR`` ``tmpdir``; return once vcuda-run
    has replaced itself with the command."""
    before = set(tmpdir.glob(f"{RUN_DIR_PREFIX}*"))
    process = subprocess.Popen(
        [sys.executable, "-m", "runtime_hook.run", *options, "--library", str(LIBRARY), "--",
         "sleep", "600"],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "TMPDIR": str(tmpdir)})
    deadline = time.monotonic() + 30
    while Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
        assert process.poll() is None and time.monotonic() < deadline, "vcuda-run did not start"
        time.sleep(0.01)
    [directory] = set(tmpdir.glob(f"{RUN_DIR_PREFIX}*")) - before
    return VcudaRun(process, directory)


class Endpoint:
    """An observer's metrics served on a free port of 127.0.0.1, as ``vcuda-node run`` does."""

    def __init__(self, observer: Observer, node: str, limits: Limits | None = None) -> None:
        self.server, _ = serve(NodeCollector(observer, node, observer.problems), "127.0.0.1", 0,
                               *([limits] if limits else []))

    def scrape(self) -> Series:
        return scrape(self.server.server_port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape(port: int) -> Series:
    """GET /metrics and parse it with prometheus_client's parser: name -> labels -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        assert answer.status == 200
        text = answer.read().decode()
    found: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return found


def labels(**pairs: str) -> frozenset:
    return frozenset(pairs.items())
