"""Parts of the simulated cluster in processes of their own, as the API server, the scheduler
and the nodes are processes (and machines) apart in a cluster, each with its own interpreter
lock: a process serves the objects of its part through a :mod:`multiprocessing` manager on a
unix socket, and callers use them through proxies, one connection per calling thread (the
process answers each connection in a thread of its own).

What goes wrong in such a process comes back as text (:class:`PartError`), as some of its
exceptions (gRPC's) cannot be pickled.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.managers import BaseManager
from pathlib import Path
from typing import ParamSpec, TypeVar

ROOT = Path(__file__).resolve().parents[2]
_AUTHKEY = "VCUDA_SIM_PART_KEY"  # the environment variable that passes the manager's key
_P = ParamSpec("_P")
_R = TypeVar("_R")


class Manager(BaseManager):
    """Each part registers the maker of its objects here."""


class PartError(RuntimeError):
    """An error in a part's process, with its traceback as text."""


def as_text(*kept: type[Exception]) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """A method raising :class:`PartError` instead of any exception but those ``kept`` (which
    the caller tells apart, and which pickle)."""
    def wrap(method: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(method)
        def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return method(*args, **kwargs)
            except kept:
                raise
            except Exception:
                raise PartError(traceback.format_exc()) from None
        return wrapped
    return wrap


@contextmanager
def process(root: Path, name: str, timeout: float = 60.0) -> Iterator[tuple[Manager, int]]:
    """A process serving the makers registered with :class:`Manager` on ``root/name.sock``:
    (a manager connected to it, its pid); the process is ended afterwards."""
    address = str(root / f"{name}.sock")
    key = os.urandom(16)
    # Not "-m": the classes must pickle by their modules' names, not __main__'s.
    process = subprocess.Popen([sys.executable, "-c", "from tests.sim.apart import main; main()",
                                address], cwd=ROOT, env={**os.environ, _AUTHKEY: key.hex()})
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(address):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the simulation's {name} process did not start")
            time.sleep(0.05)
        manager = Manager(address, key)
        manager.connect()
        yield manager, process.pid
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    """Serve the parts' makers on the unix socket named by the first argument."""
    import tests.sim.api
    import tests.sim.nodes  # noqa: F401 - importing registers the makers

    manager = Manager(sys.argv[1], bytes.fromhex(os.environ[_AUTHKEY]))
    manager.get_server().serve_forever()
