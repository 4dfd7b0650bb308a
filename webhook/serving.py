"""One aiohttp low-level server on one port, with a TLS certificate reloaded as its files change.

The webhook and the scheduler extender both serve this way: a few fixed routes need no
router or middleware, and that layer is a measurable part of each request's cost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from webhook.tls import CertificateReloader

if TYPE_CHECKING:  # the parts of a request that aiohttp hands a request factory
    from aiohttp.abc import AbstractStreamWriter
    from aiohttp.http import RawRequestMessage
    from aiohttp.streams import StreamReader
    from aiohttp.web_protocol import RequestHandler

Dispatch = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Serving:
    """``dispatch`` answering on ``host``:``port`` between ``start`` and ``stop``."""

    def __init__(self, dispatch: Dispatch, max_body: int,
                 certificates: CertificateReloader | None = None,
                 reload_interval: float = 1.0) -> None:
        """Args:
            dispatch: answers every request.
            max_body: the largest request body accepted (aiohttp's default is 1 MiB).
            certificates: serve HTTPS with these, polled every ``reload_interval``
                seconds; None: plain HTTP.
        """
        self._dispatch = dispatch
        self._max_body = max_body
        self._certificates = certificates
        self._reload_interval = reload_interval
        self._runner: web.ServerRunner | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def start(self, host: str | None, port: int) -> int:
        """Listen on ``host`` (None: every address) and ``port`` (0: any); return the port."""
        loop = asyncio.get_running_loop()
        max_body = self._max_body

        def make_request(message: RawRequestMessage, payload: StreamReader,
                         protocol: RequestHandler, writer: AbstractStreamWriter,
                         task: asyncio.Task[None]) -> web.BaseRequest:
            return web.BaseRequest(message, payload, protocol, writer, task, loop,
                                   client_max_size=max_body)

        server = web.Server(self._dispatch, request_factory=make_request, access_log=None)
        self._runner = web.ServerRunner(server, shutdown_timeout=10)
        await self._runner.setup()
        context = self._certificates.context if self._certificates else None
        await web.TCPSite(self._runner, host, port, ssl_context=context).start()
        if self._certificates is not None:
            self._watcher = loop.create_task(self._certificates.watch(self._reload_interval))
        return self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop polling, stop listening, and let requests in progress finish (10 s at most)."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._runner is not None:
            await self._runner.cleanup()
