"""The metrics endpoint's HTTP server: a thread per connection, few connections, and deadlines.

Whoever can reach the port may open connections and send nothing, or a byte
at a time. So a connection must send its first byte within ``idle_timeout``
and its whole request head within ``header_timeout``, or it is closed; the
answer is written with ``write_timeout`` on each send. At most
``max_connections`` are served at once: a new connection beyond that closes the
one that has waited longest for its request head, so a scraper that sends its
request at once is answered while idle connections come and go; when every
connection is already being answered, the new one is closed at once.
Each connection carries one request (HTTP/1.0), as wsgiref answers it.
"""

from __future__ import annotations

import contextlib
import io
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

MAX_CONNECTIONS = 16
IDLE_TIMEOUT = 5.0  # seconds to the request's first byte
HEADER_TIMEOUT = 10.0  # seconds to the end of its head
WRITE_TIMEOUT = 10.0  # seconds for each send of the answer
MAX_HEAD = 16 << 10  # bytes: a scrape's request head is a few hundred
_HEAD_END = (b"\r\n\r\n", b"\n\n")


class Limits:
    """How many connections at once, and the deadlines of each (seconds)."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS, idle: float = IDLE_TIMEOUT,
                 header: float = HEADER_TIMEOUT, write: float = WRITE_TIMEOUT) -> None:
        self.max_connections, self.idle, self.header, self.write = (
            max_connections, idle, header, write)


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.opened = time.monotonic()
        self.reading = True  # still waiting for its request head: may be closed for room
        self.evicted = False


class BoundedServer(WSGIServer):
    """wsgiref's server, with a bounded thread per connection (see the module's docstring)."""

    request_queue_size = 128  # the listen backlog: a burst of connections is accepted, not lost

    def __init__(self, address: tuple[str, int], limits: Limits) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.limits = limits
        self._lock = threading.Lock()
        self._open: dict[socket.socket, _Connection] = {}
        super().__init__(address, _Handler)

    def connections(self) -> int:
        """How many connections are open now."""
        with self._lock:
            return len(self._open)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            if not self._room():
                self.shutdown_request(request)
                return
            self._open[request] = _Connection(request)
        threading.Thread(target=self._serve, args=(request, client_address), daemon=True,
                         name="vcuda-metrics-connection").start()

    def _room(self) -> bool:
        """Whether a new connection may be served, closing a waiting one if need be (hold the
        lock). Connections closed for room count until their thread ends, up to twice the
        bound: threads stay bounded however fast connections come."""
        live = [c for c in self._open.values() if not c.evicted]
        if len(live) < self.limits.max_connections:
            return True
        waiting = [c for c in live if c.reading]
        if not waiting or len(self._open) >= 2 * self.limits.max_connections:
            return False
        oldest = min(waiting, key=lambda c: c.opened)
        oldest.evicted = True
        with contextlib.suppress(OSError):
            oldest.sock.shutdown(socket.SHUT_RDWR)  # its read ends now, and its thread
        return True

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:  # the client went away while answered
            pass
        finally:
            with self._lock:
                self._open.pop(request, None)
            self.shutdown_request(request)

    def read_head(self, sock: socket.socket) -> bytes | None:
        """The request head sent on ``sock`` within the deadlines; None when the client was
        too slow, sent too much, or went away."""
        start = time.monotonic()
        head = b""
        try:
            while len(head) <= MAX_HEAD:
                deadline = start + (self.limits.header if head else self.limits.idle)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
                data = sock.recv(4096)
                if not data:
                    return None
                head += data
                if any(end in head for end in _HEAD_END):
                    with self._lock:
                        connection = self._open.get(sock)
                        if connection is None or connection.evicted:
                            return None
                        connection.reading = False
                    sock.settimeout(self.limits.write)
                    return head
        except OSError:  # a timeout, or a reset
            return None
        return None


class _Handler(WSGIRequestHandler):
    """wsgiref's handler over a request head read within the server's deadlines; no access log
    (a scrape every few seconds would fill it)."""

    server: BoundedServer

    def handle(self) -> None:
        head = self.server.read_head(self.connection)
        if head is None:
            return
        self.rfile = io.BytesIO(head)
        super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""


def serve(app: Callable[..., Any], address: str, port: int,
          limits: Limits | None = None) -> tuple[BoundedServer, threading.Thread]:
    """Serve the WSGI ``app`` on address:port in a thread; return (server, thread)."""
    server = BoundedServer((address, port), limits or Limits())
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="vcuda-metrics")
    thread.start()
    return server, thread
