"""One aiohttp low-level server on one port, with a TLS certificate reloaded as its files change.

The webhook and the scheduler extender both serve this way: a few fixed routes need no
router or middleware, and that layer is a measurable part of each request's cost.

Whoever can open a connection to the port must not be able to take the
process down, so the server holds each client to :class:`Guards`: a cap on
open connections (counted from accept, TLS handshakes included), on the
bytes of request bodies held at once (all connections together), a deadline
for the TLS handshake, for a request's head
(from connecting, or from the last answer on a kept-alive connection) and for
its body. A body is read only through :meth:`Serving.read_body`, which keeps
that count, refuses compressed bodies (nothing is inflated) and answers a
refusal as :class:`BodyRefused`. Large buffers go back to the system when freed
(:class:`_Libc`), so memory taken by a burst is not kept.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import resource
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from time import monotonic
from typing import TYPE_CHECKING, Any

import uvloop
from aiohttp import ClientError, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from uvloop.loop import SSLProtocol as _UvloopTls  # type: ignore[attr-defined]  # no stub

from webhook.errors import WebhookError
from webhook.tls import CertificateReloader

if TYPE_CHECKING:  # the parts of a request that aiohttp hands a request factory
    from aiohttp.abc import AbstractStreamWriter
    from aiohttp.http import RawRequestMessage
    from aiohttp.streams import StreamReader

Dispatch = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
CLOSE_REASONS = ("connection_limit", "head_timeout", "body_timeout")
_CHUNK = 64 << 10
_M_MMAP_THRESHOLD = -3  # mallopt(3)
_TRIM_AFTER = 1 << 20  # bytes of body let go after which the heap is trimmed
_SPARE_FILES = 64  # descriptors besides the connections: listening sockets, API clients, logs


@dataclass(frozen=True)
class Guards:
    """What one client may hold of the server.

    Attributes:
        max_connections: open connections, from accept on (past it, a new one is closed
            at once).
        max_buffered: bytes of request bodies held at once over all connections
            (a body counts twice: its chunks and the joined copy).
        handshake_timeout: seconds for a TLS handshake.
        head_timeout: seconds for a new connection's first request head to arrive.
        idle_timeout: seconds a kept-alive connection may wait for its next request after an
            answer. Longer than the 90 s for which the Go clients that call vcuda
            (kube-apiserver, kube-scheduler) keep an idle connection, so that they close it
            first: a server that closes first races the client's next POST on it, which Go
            does not retry (on the real cluster, 1 review in 2,288 failed with EOF). A
            client can hold a connection no longer than by reconnecting every head_timeout.
        body_timeout: seconds for a request's whole body to arrive.
    """

    max_connections: int = 128
    max_buffered: int = 32 << 20
    handshake_timeout: float = 5.0
    head_timeout: float = 10.0
    idle_timeout: float = 120.0
    body_timeout: float = 10.0


DEFAULT_GUARDS = Guards()


class BodyRefused(WebhookError):
    """A body that is not read: ``status`` and a one-line ``message`` for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _GuardedServer(web.Server):
    """aiohttp's server, counting its connections from accept and noting when each went idle."""

    def __init__(self, dispatch: Dispatch, **kwargs: Any) -> None:
        super().__init__(dispatch, **kwargs)
        # When each connection last had no request in hand; None while one is handled.
        self.idle_since: dict[RequestHandler, float | None] = {}
        self.answered: set[RequestHandler] = set()  # kept alive after an answer
        # Accepted, and not yet made (a TLS connection is made once its handshake is done).
        self.accepted: set[RequestHandler] = set()
        self._made = 0  # made and not yet lost

    @property
    def open_connections(self) -> int:
        """Connections from accept until their socket closes, TLS handshakes included."""
        return len(self.accepted) + self._made

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.accepted.discard(handler)
        self._made += 1
        self.idle_since[handler] = monotonic()

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        self._made -= 1
        self.idle_since.pop(handler, None)
        self.answered.discard(handler)
        super().connection_lost(handler, exc)


class _Refuse(asyncio.Protocol):
    """A connection over the cap: closed as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()  # type: ignore[attr-defined]


class _PythonTls(sslproto.SSLProtocol):
    """asyncio's TLS layer, for loops other than uvloop."""

    # asyncio gives each connection a read buffer of 256 KiB from its accept on:
    # that, not the requests, was most of the memory of many idle connections.
    max_size = 32 << 10


class _Site(web.TCPSite):
    """A TCP site that caps accepted connections and gives TLS handshakes a deadline.

    The TLS layer is the loop's own (uvloop's is C; a review's share of asyncio's
    Python one was a fifth of its cost), made here rather than by the loop so that a
    connection counts from its accept: one that fails or stalls in its handshake never
    reaches aiohttp, and is let go when the handshake's outcome is known.
    """

    def __init__(self, runner: web.ServerRunner, host: str | None, port: int,
                 context: Any, guards: Guards, closed: dict[str, int]) -> None:
        super().__init__(runner, host, port)
        self._context = context
        self._guards = guards
        self._closed = closed
        self._tls: Callable[..., asyncio.BaseProtocol] = _PythonTls

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        if isinstance(loop, uvloop.Loop):
            self._tls = _UvloopTls
        self._server = await loop.create_server(
            self._accept, self._host, self._port, backlog=self._backlog)

    def _accept(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert isinstance(server, _GuardedServer)
        if server.open_connections >= self._guards.max_connections:
            self._closed["connection_limit"] += 1
            return _Refuse()
        handler = server()
        server.accepted.add(handler)
        if self._context is None:
            return handler
        loop = asyncio.get_running_loop()
        handshake = loop.create_future()
        handshake.add_done_callback(partial(_handshake_over, server.accepted, handler))
        return self._tls(loop, handler, self._context, handshake, server_side=True,
                         ssl_handshake_timeout=self._guards.handshake_timeout)


def _handshake_over(accepted: set[RequestHandler], handler: RequestHandler,
                    handshake: asyncio.Future[None]) -> None:
    """A TLS handshake ended: made (aiohttp has the connection now) or failed (it is closed)."""
    if not handshake.cancelled():
        handshake.exception()  # a failed handshake is the client's matter, not logged
    accepted.discard(handler)


def allow_open_files(wanted: int, log: Any = None) -> int:
    """Raise this process's soft limit of open files to ``wanted`` where the hard limit allows
    (a connection past it would wait at accept); return the soft limit now (RLIM_INFINITY:
    none). Logs a warning on ``log`` when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        if target < wanted and log is not None:
            log.warning("open_file_limit", limit=target, wanted=wanted,
                        reason="the hard limit of open files is lower than the connections "
                               "allowed need: raise it (ulimit -n) for the container runtime")
    return soft


class Serving:
    """``dispatch`` answering on ``host``:``port`` between ``start`` and ``stop``."""

    def __init__(self, dispatch: Dispatch, max_body: int,
                 certificates: CertificateReloader | None = None,
                 reload_interval: float = 1.0, guards: Guards = DEFAULT_GUARDS,
                 log: Any = None) -> None:
        """Args:
            dispatch: answers every request.
            max_body: the largest request body accepted.
            certificates: serve HTTPS with these, polled every ``reload_interval``
                seconds; None: plain HTTP.
            guards: what one client may hold (see :class:`Guards`).
            log: a structlog logger for connections closed by a guard; None: not logged.
        """
        self._dispatch = dispatch
        self._max_body = max_body
        self._certificates = certificates
        self._reload_interval = reload_interval
        self._guards = guards
        self._log = log
        self._buffered = 0
        self._held: dict[int, int] = {}  # body bytes counted, by id() of the request
        self.closed = dict.fromkeys(CLOSE_REASONS, 0)  # connections closed by a guard
        self._server: _GuardedServer | None = None
        self._runner: web.ServerRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def buffered(self) -> int:
        """Bytes of request bodies held now, as counted against ``Guards.max_buffered``."""
        return self._buffered

    async def start(self, host: str | None, port: int) -> int:
        """Listen on ``host`` (None: every address) and ``port`` (0: any); return the port."""
        _LIBC.fix_threshold()
        allow_open_files(self._guards.max_connections + _SPARE_FILES, self._log)
        loop = asyncio.get_running_loop()
        max_body = self._max_body

        def make_request(message: RawRequestMessage, payload: StreamReader,
                         protocol: RequestHandler, writer: AbstractStreamWriter,
                         task: asyncio.Task[None]) -> web.BaseRequest:
            return web.BaseRequest(message, payload, protocol, writer, task, loop,
                                   client_max_size=max_body)

        self._server = _GuardedServer(
            self._guarded, request_factory=make_request,
            access_log=None, auto_decompress=False, max_headers=32, lingering_time=1.0,
            # A backstop: the head and idle deadlines close idle connections first.
            keepalive_timeout=2 * max(self._guards.head_timeout, self._guards.idle_timeout) + 1)
        self._runner = web.ServerRunner(self._server, shutdown_timeout=10)
        await self._runner.setup()
        context = self._certificates.context if self._certificates else None
        await _Site(self._runner, host, port, context, self._guards, self.closed).start()
        self._tasks.append(loop.create_task(self._close_slow_heads()))
        if self._certificates is not None:
            self._tasks.append(loop.create_task(self._certificates.watch(self._reload_interval)))
        return self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop polling, stop listening, and let requests in progress finish (10 s at most)."""
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._runner is not None:
            await self._runner.cleanup()

    async def read_body(self, request: web.BaseRequest) -> bytes:
        """Return the request's body; raise BodyRefused when it is not to be read.

        Refused: a ``Content-Encoding`` other than identity (400), a body over
        ``max_body`` (413), one that would pass ``Guards.max_buffered`` (503),
        one that does not arrive within ``Guards.body_timeout`` (408). The
        bytes stay counted until the request is answered.
        """
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise BodyRefused(400, f"Content-Encoding {encoding[:40]!r} is not accepted: "
                                   "send the body uncompressed")
        length = request.content_length
        if length is not None:
            self._check_size(length)
            self._reserve(request, 2 * length)
            if request.content.is_eof() and request.content.total_bytes == length:
                # The whole body came with the head, as most do: nothing to wait for, so no
                # deadline to arm (a timer and a task a request were a tenth of its cost).
                return await request.content.read()
        try:
            return await asyncio.wait_for(self._read(request, length), self._guards.body_timeout)
        except asyncio.TimeoutError:
            self._note_closed("body_timeout", request)
            raise BodyRefused(408, f"the body did not arrive within "
                                   f"{self._guards.body_timeout:g} s") from None
        except (OSError, ClientError, HttpProcessingError) as exc:  # the client went or lied
            raise BodyRefused(400, f"the body could not be read ({type(exc).__name__})") from None

    async def _read(self, request: web.BaseRequest, length: int | None) -> bytes:
        chunks, size = [], 0
        async for chunk in request.content.iter_chunked(_CHUNK):
            size += len(chunk)
            self._check_size(size)
            if length is None:
                self._reserve(request, 2 * len(chunk))
            chunks.append(chunk)
        return b"".join(chunks)

    def _check_size(self, size: int) -> None:
        if size > self._max_body:
            raise BodyRefused(413, f"the body is over the {self._max_body}-byte limit: "
                                   f"got {size} bytes or more")

    def _reserve(self, request: web.BaseRequest, size: int) -> None:
        if self._buffered + size > self._guards.max_buffered:
            raise BodyRefused(503, f"the server holds {self._buffered} bytes of request bodies "
                                   f"already, its most ({self._guards.max_buffered}); retry")
        self._buffered += size
        self._held[id(request)] = self._held.get(id(request), 0) + size

    async def _guarded(self, request: web.BaseRequest) -> web.StreamResponse:
        """Dispatch with the connection marked busy; free what its body held afterwards."""
        idle = self._server.idle_since if self._server else {}
        if request.protocol in idle:
            idle[request.protocol] = None
        try:
            response = await self._dispatch(request)
            if not request.content.at_eof():
                response.force_close()  # the rest of a refused body is not read
            return response
        finally:
            held = self._held.pop(id(request), 0)
            self._buffered -= held
            if held >= _TRIM_AFTER:
                _LIBC.trim()
            if request.protocol in idle:
                idle[request.protocol] = monotonic()
                if self._server is not None:
                    self._server.answered.add(request.protocol)

    async def _close_slow_heads(self) -> None:
        """Close new connections that sent no whole request head within ``head_timeout`` (a
        guard: counted and logged), and kept-alive ones idle for ``idle_timeout`` (their
        end of life: neither)."""
        head, idle = self._guards.head_timeout, self._guards.idle_timeout
        while True:
            await asyncio.sleep(min(head / 4, 1.0))
            assert self._server is not None
            now = monotonic()
            for handler, since in list(self._server.idle_since.items()):
                kept = handler in self._server.answered
                if since is None or now - since <= (idle if kept else head) \
                        or not handler.transport:
                    continue
                del self._server.idle_since[handler]
                handler.transport.close()
                if kept:
                    continue
                self.closed["head_timeout"] += 1
                if self._log is not None:
                    self._log.warning("connection_closed", reason="head_timeout",
                                      peer=_peer(handler.transport), seconds=head)

    def _note_closed(self, reason: str, request: web.BaseRequest) -> None:
        self.closed[reason] += 1
        if self._log is not None:
            self._log.warning("connection_closed", reason=reason,
                              peer=_peer(request.transport), path=request.path)


def _peer(transport: asyncio.BaseTransport | None) -> str:
    peer = transport.get_extra_info("peername") if transport else None
    return f"{peer[0]}:{peer[1]}" if peer else "unknown"


class _Libc:
    """glibc's knobs for giving freed memory back to the system; no-ops elsewhere.

    glibc's threshold for serving a buffer with its own mapping rises to the
    largest buffer freed (up to 32 MiB), after which bodies of a few MiB are
    carved from the heap and stay in the process after a burst; and the heap
    keeps what the body's 64 KiB chunks took. Fixing the threshold, and trimming
    the heap after a large body is let go, return both.
    """

    def __init__(self) -> None:
        self._libc: Any = None
        with contextlib.suppress(OSError):
            libc = ctypes.CDLL(None)
            if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim"):
                self._libc = libc

    def fix_threshold(self) -> None:
        if self._libc is not None:
            self._libc.mallopt(_M_MMAP_THRESHOLD, 128 << 10)

    def trim(self) -> None:
        if self._libc is not None:
            self._libc.malloc_trim(0)


_LIBC = _Libc()


def tcp_port(text: str) -> int:
    """argparse type: a TCP port, 0..65535 (0: any free one)."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: write 1..65535 (0: any free)")
    return int(text)
