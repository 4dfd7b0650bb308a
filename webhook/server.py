"""The vcuda-webhook HTTPS server: routes, command line, start-up and shutdown."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from time import perf_counter
from typing import Any

import uvloop
from aiohttp import web

from runtime_hook.contract import count_flag, in_cluster, positive_seconds, version_flag
from webhook.admission import Answer, admit, refuse
from webhook.config import Config, ConfigError, load_config
from webhook.kube import Credentials, Kube, KubeError
from webhook.largest_gpu import LargestGpu
from webhook.logs import info_writer, make_logger
from webhook.metrics import CONTENT_TYPE, Metrics
from webhook.pki import write_self_signed
from webhook.remembered import RememberedDecisions
from webhook.review import MAX_BODY, body_too_large
from webhook.serving import (
    DEFAULT_GUARDS,
    BodyRefused,
    Guards,
    Serving,
    tcp_port,
)
from webhook.tls import CertificateError, CertificateReloader

DEFAULT_PORT = 8443
NODES_INTERVAL = 60.0  # seconds between two lists of the Nodes' largest GPU share


class _Handlers:
    """The routes and their handlers; /mutate only moves bytes, times, counts and logs."""

    def __init__(self, config: Config, certificates: CertificateReloader, log: Any,
                 reload_interval: float, guards: Guards) -> None:
        self._configured = config
        self.config = config  # what reviews are judged by: config, bounded by the Nodes
        self._decisions = RememberedDecisions()
        self._certificates = certificates
        self._log = log
        self._info = info_writer(log)
        # The API server's cap on a review, instead of aiohttp's default of 1 MiB.
        self.serving = Serving(self.dispatch, MAX_BODY, certificates, reload_interval, guards,
                               log)
        self.metrics = Metrics(certificates.seconds_left, lambda: self.serving.closed,
                               lambda: self.config.max_gpu_memory)
        self._routes = {("POST", "/mutate"): self.mutate, ("GET", "/healthz"): self.healthz,
                        ("GET", "/readyz"): self.readyz, ("GET", "/metrics"): self.metrics_text}

    def use_max_gpu_memory(self, largest: int | None) -> None:
        """Bound vcuda-memory by ``largest`` bytes from now on (None: the configured bound)."""
        config = self._configured if largest is None else \
            replace(self._configured, max_gpu_memory=largest)
        if config != self.config:  # a new config forgets the decisions made under the old
            self.config = config

    async def dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        handler = self._routes.get((request.method, request.path))
        if handler is not None:
            return await handler(request)
        allowed = [method for method, path in self._routes if path == request.path]
        if allowed:
            return web.Response(status=405, text=f"{request.path} takes {allowed[0]} only\n",
                                headers={"Allow": allowed[0]})
        return web.Response(status=404, text="not found: this server answers POST /mutate, "
                                             "GET /healthz, /readyz and /metrics\n")

    async def mutate(self, request: web.BaseRequest) -> web.Response:
        started = perf_counter()
        try:
            answer = admit(await self.serving.read_body(request), self.config,
                           self._decisions.decide)
        except BodyRefused as exc:
            answer = refuse(body_too_large(request.content_length) if exc.status == 413
                            else exc.message, 400 if exc.status == 413 else exc.status)
        except Exception as exc:  # a bug: answered, logged and counted, never a traceback page
            self._log.exception("review_failed", error=f"{type(exc).__name__}: {exc}")
            answer = refuse(f"the webhook failed on this review ({type(exc).__name__}); "
                            "see its log", 500)
        self.metrics.observe(answer.outcome, perf_counter() - started)
        self._log_answer(answer)
        return web.Response(status=answer.status, body=answer.body,
                            content_type="application/json" if answer.status == 200
                            else "text/plain")

    async def healthz(self, _: web.BaseRequest) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, _: web.BaseRequest) -> web.Response:
        if self._certificates.seconds_left() <= 0:
            return web.Response(status=503, text="the serving certificate has expired\n")
        return web.Response(text="ok\n")

    async def metrics_text(self, _: web.BaseRequest) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def _log_answer(self, answer: Answer) -> None:
        request = answer.request
        if request is None:
            self._log.warning("review", decision=answer.outcome, reason=answer.reason)
            return
        extra = {"warnings": answer.warnings, "dry_run": request.dry_run} \
            if answer.warnings or request.dry_run else {}
        self._info("review", uid=request.uid, namespace=request.namespace, pod=request.name,
                   operation=request.operation, decision=answer.outcome, reason=answer.reason,
                   **extra)


class WebhookServer:
    """The webhook serving over TLS, and polling its certificate files, between start and stop.

    It runs on aiohttp's low-level server: four fixed routes need no router or
    middleware, and that layer is a measurable part of a review's cost.
    """

    def __init__(self, config: Config, certificates: CertificateReloader, log: Any,
                 reload_interval: float = 1.0, guards: Guards = DEFAULT_GUARDS,
                 api: Credentials | None = None,
                 nodes_interval: float = NODES_INTERVAL) -> None:
        """Args:
            config: the policy settings.
            certificates: owner of the SSLContext served with.
            log: a structlog logger (see ``webhook.logs.make_logger``).
            reload_interval: seconds between looks at the certificate files.
            guards: what one client may hold of the server (connections, bytes, time).
            api: where to read the Nodes' largest GPU share, when
                ``config.max_gpu_memory_from_nodes``; None: nowhere.
            nodes_interval: seconds between two reads of the Nodes.
        """
        self._handlers = _Handlers(config, certificates, log, reload_interval, guards)
        self._serving = self._handlers.serving
        self._api = api if config.max_gpu_memory_from_nodes else None
        self._nodes_interval = nodes_interval
        self._log = log
        self._kube: Kube | None = None
        self._learning: asyncio.Task[None] | None = None

    @property
    def max_gpu_memory(self) -> int:
        """The bound on vcuda-memory now, in bytes."""
        return self._handlers.config.max_gpu_memory

    async def start(self, host: str | None, port: int) -> int:
        """Listen on ``host`` (None: every address) and ``port`` (0: any); return the port.

        With ``api``, the Nodes are read once before (so that the first review is
        bounded by the cluster's largest GPU), then every ``nodes_interval``.
        """
        if self._api is not None:
            self._kube = Kube(self._api, connections=1)
            largest = LargestGpu(self._kube, self._nodes_interval, self._log,
                                 self._handlers.use_max_gpu_memory)
            await largest.refresh()
            self._learning = asyncio.create_task(largest.run())
        return await self._serving.start(host, port)

    async def stop(self) -> None:
        """Stop polling, stop listening, and let requests in progress finish (10 s at most)."""
        if self._learning is not None:
            self._learning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._learning
        if self._kube is not None:
            await self._kube.close()
        await self._serving.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vcuda-webhook",
        description="Admission webhook of vcuda: checks the docker.com/vcuda-core and "
                    "vcuda-memory limits of new pods and adds the device-plugin resource, the "
                    "vcuda.io/limits annotation and the vcuda runtime class. Serves POST "
                    "/mutate (AdmissionReview v1), GET /healthz, /readyz and /metrics over "
                    "HTTPS. Logs one JSON line per review on standard output.")
    version_flag(parser)
    parser.add_argument("--host", default=None,
                        help="address to listen on (default: all addresses)")
    parser.add_argument("--port", type=tcp_port, default=DEFAULT_PORT,
                        help=f"port to listen on, 1..65535, or 0 for any free one "
                             f"(default: {DEFAULT_PORT})")
    parser.add_argument("--cert-file", type=Path,
                        help="PEM serving certificate, then any intermediates; reloaded when "
                             "it changes (e.g. tls.crt of a mounted Secret)")
    parser.add_argument("--key-file", type=Path,
                        help="PEM private key of --cert-file, unencrypted (e.g. tls.key)")
    parser.add_argument("--self-signed", action="store_true",
                        help="serve with a throwaway CA and localhost certificate made at start, "
                             "for trying the webhook locally; the CA's file is logged")
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help="JSON policy settings (keys in docs/WEBHOOK.md); "
                             "keys left out keep their defaults")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="credentials to read the Nodes, whose largest GPU bounds "
                             "vcuda-memory unless --config sets max_gpu_memory (default: the "
                             "pod's service account in a cluster; elsewhere none)")
    parser.add_argument("--nodes-interval", type=positive_seconds, default=NODES_INTERVAL,
                        metavar="SECONDS",
                        help="how often the Nodes are read (default: %(default)g)")
    parser.add_argument("--reload-interval", type=positive_seconds, default=1.0, metavar="SECONDS",
                        help="how often to look for a new certificate and key (default: 1)")
    guards = DEFAULT_GUARDS
    parser.add_argument("--max-connections", type=count_flag, default=guards.max_connections,
                        metavar="N", help="open connections served at once; more are closed "
                                          "at once (default: %(default)s)")
    parser.add_argument("--max-buffered-mib", type=count_flag,
                        default=guards.max_buffered >> 20, metavar="MIB",
                        help="MiB of request bodies held at once over all connections (a body "
                             "counts twice); past it a review gets 503 (default: %(default)s)")
    parser.add_argument("--read-timeout", type=positive_seconds, default=guards.body_timeout,
                        metavar="SECONDS",
                        help="seconds a client has for a request's head, and again for its "
                             "body; an idle connection is closed after it (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the webhook until SIGINT or SIGTERM."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.self_signed == bool(args.cert_file or args.key_file):
        parser.error("give --cert-file and --key-file, or --self-signed to try it locally")
    if not args.self_signed and not (args.cert_file and args.key_file):
        parser.error("--cert-file and --key-file go together")
    log = make_logger(sys.stdout.buffer)
    try:
        config = load_config(args.config) if args.config else Config()
    except ConfigError as exc:
        parser.error(f"--config {exc}")
    with contextlib.ExitStack() as cleanup:
        cert_file, key_file = args.cert_file, args.key_file
        if args.self_signed:
            scratch = Path(cleanup.enter_context(tempfile.TemporaryDirectory(
                prefix="vcuda-webhook-")))
            ca_file, cert_file, key_file = write_self_signed(scratch)
            log.info("self_signed", ca_file=str(ca_file),
                     try_it=f"curl --cacert {ca_file} https://localhost:{args.port}/healthz")
        try:
            certificates = CertificateReloader(cert_file, key_file, log)
        except CertificateError as exc:
            parser.error(str(exc))
        guards = Guards(max_connections=args.max_connections,
                        max_buffered=args.max_buffered_mib << 20,
                        head_timeout=args.read_timeout, body_timeout=args.read_timeout)
        try:
            api = _nodes_api(config, args.kubeconfig, log)
        except KubeError as exc:
            parser.error(f"--kubeconfig: {exc.message}")
        webhook = WebhookServer(config, certificates, log, args.reload_interval, guards, api,
                                args.nodes_interval)
        # What is loaded by now lives as long as the process: the collector need not walk it
        # on each pass it makes over a review's short-lived objects.
        gc.freeze()
        # uvloop's TLS and event loop are C: a review's share of them was a fifth of its cost.
        return uvloop.run(_serve(webhook, args.host, args.port, config, log))


def _nodes_api(config: Config, kubeconfig: str | None, log: Any) -> Credentials | None:
    """Where to read the Nodes' largest GPU share: ``kubeconfig``, else the pod's service
    account in a cluster, else nowhere (the configured bound stands). A service account
    that is not there is logged; a ``kubeconfig`` that does not work raises KubeError."""
    if not config.max_gpu_memory_from_nodes:
        return None
    if kubeconfig is None and not in_cluster(None):
        return None
    try:
        return Credentials.load(kubeconfig)
    except KubeError as exc:
        if kubeconfig is not None:
            raise
        log.warning("max_gpu_memory_unread", reason=exc.message)
        return None


async def _serve(webhook: WebhookServer, host: str | None, port: int, config: Config,
                 log: Any) -> int:
    """Serve until SIGINT or SIGTERM; return 0, or 1 when the address cannot be listened on."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stop.set)
    try:
        bound = await webhook.start(host, port)
    except OSError as exc:  # in use, not an address of this machine, a name that does not resolve
        where = f"{host or 'all addresses'} port {port}"
        # asyncio rewords a bind error; the errno's own text is the plain reason.
        reason = exc.strerror if isinstance(exc, socket.gaierror) or not exc.errno \
            else os.strerror(exc.errno)
        print(f"vcuda-webhook: error: cannot listen on {where}: {reason}; give a free --port "
              "and a --host that is an address of this machine", file=sys.stderr)
        await webhook.stop()
        return 1
    log.info("serving", host=host or "all addresses", port=bound,
             loop=type(loop).__module__.partition(".")[0],
             domains=list(config.domains), runtime_class=config.runtime_class,
             max_gpu_memory=webhook.max_gpu_memory)
    await stop.wait()
    log.info("stopping")
    await webhook.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
