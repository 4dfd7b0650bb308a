"""gRPC interfaces vcuda speaks, compiled from the ``.proto`` subsets beside this file at run time.

Each ``<name>.proto`` here is written for vcuda from the upstream definition
it names (field numbers and package as upstream, only the messages vcuda
uses). :func:`load` compiles one with ``grpc.protos_and_services`` (protoc
from grpcio-tools, in process) and returns its message and service modules;
the tests load their own (CRI) from their folder the same way. Protobuf
registers files by name in one pool: a process loads one file of each name.
"""

from __future__ import annotations

import os
import sys
import threading
from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))
_LOCK = threading.Lock()


def load(name: str, directory: str = _HERE) -> tuple[ModuleType, ModuleType]:
    """The (messages, services) modules of ``<directory>/<name>.proto`` (this folder's by
    default); later calls return the same."""
    import grpc  # only the gRPC parts of the node agent pay for it

    path = os.path.join(directory, f"{name}.proto")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no protocol {name!r}: {path} is missing")
    with _LOCK:
        # protoc resolves the file against sys.path; its folder goes first for the call.
        sys.path.insert(0, directory)
        try:
            return grpc.protos_and_services(f"{name}.proto")
        finally:
            sys.path.remove(directory)
