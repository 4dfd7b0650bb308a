"""The vcuda-scheduler-extender HTTP(S) server: routes, command line, start-up and shutdown."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

import uvloop
from aiohttp import web

from extender.bind import Binder
from extender.node_events import NodeEvents
from extender.nodes import NodeView, NodeWatch
from extender.policy import STRATEGIES
from extender.service import Extender, Outcome
from extender.wire import BadArguments
from runtime_hook.contract import positive_seconds, version_flag
from webhook.config import Config, ConfigError
from webhook.kube import Credentials, Kube, KubeError
from webhook.logs import make_logger
from webhook.metrics import CONTENT_TYPE
from webhook.serving import BodyRefused, Guards, Serving, tcp_port
from webhook.tls import CertificateError, CertificateReloader

DEFAULT_PORT = 8888
DEFAULT_MAX_AGE = 120.0
MAX_BODY = 8 << 20  # a Pod (etcd keeps at most 1.5 MiB) and the names of thousands of nodes
# kube-scheduler opens a connection per bind in flight (its client sets no cap per host), each
# waiting at most the extender's httpTimeout (10 s as shipped): against a slow API server, the
# scheduler's rate times that, a couple of thousand at most. Past the cap a new connection is
# closed at once, and its bind fails.
MAX_CONNECTIONS = 4096
# The metrics port serves Prometheus' few scrapers: bodies are never read there.
_METRICS_GUARDS = Guards(max_connections=64, max_buffered=1 << 16)


class ExtenderServer:
    """The extender's routes between ``start`` and ``stop``."""

    def __init__(self, extender: Extender, watch: NodeWatch, log: Any,
                 certificates: CertificateReloader | None = None,
                 events: NodeEvents | None = None) -> None:
        self._extender = extender
        self._watch = watch
        self._events = events
        self._background: list[asyncio.Task[None]] = []
        self._metrics = extender.metrics
        self._log = log
        # Two bodies of the largest size at once: the scheduler sends one at a time.
        self._serving = Serving(self._dispatch, MAX_BODY, certificates,
                                guards=Guards(max_connections=MAX_CONNECTIONS,
                                              max_buffered=4 * MAX_BODY), log=log)
        self._routes = {("POST", "/filter"): self._filter, ("POST", "/prioritize"):
                        self._prioritize, ("POST", "/bind"): self._bind,
                        ("GET", "/healthz"): self._ok, ("GET", "/readyz"): self._ready,
                        ("GET", "/metrics"): self._metrics_text}
        self._metrics_serving = Serving(self._metrics_only, 0, guards=_METRICS_GUARDS, log=log)

    async def start(self, host: str | None, port: int) -> int:
        """Watch the nodes, and listen on ``host`` (None: all addresses) and ``port`` (0: any);
        return the port."""
        self._background.append(asyncio.create_task(self._watch.run()))
        if self._events is not None:
            self._background.append(asyncio.create_task(self._events.run()))
        return await self._serving.start(host, port)

    async def start_metrics(self, host: str | None, port: int) -> int:
        """Also serve GET /metrics and /healthz, and nothing else, over plain HTTP on ``host``
        and ``port`` (0: any): for Prometheus, while the scheduler's port stays on loopback,
        where no one else may call bind. Return the port."""
        return await self._metrics_serving.start(host, port)

    async def stop(self) -> None:
        """Stop listening once requests in progress are answered (10 s at most), then stop
        watching and let the Events in flight be written."""
        await self._metrics_serving.stop()
        await self._serving.stop()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._events is not None:
            await self._events.settled()

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        handler = self._routes.get((request.method, request.path))
        if handler is not None:
            return await handler(request)
        if any(path == request.path for _, path in self._routes):
            return web.Response(status=405, text=f"{request.path}: wrong method\n")
        return web.Response(status=404, text="not found: this server answers POST /filter, "
                                             "/prioritize, /bind and GET /healthz, /readyz "
                                             "and /metrics\n")

    async def _metrics_only(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method == "GET" and request.path in ("/metrics", "/healthz"):
            return await self._routes["GET", request.path](request)
        return web.Response(status=404, text="not found: this port answers GET /metrics and "
                                             "/healthz only; the extender's verbs are on --port\n")

    async def _filter(self, request: web.BaseRequest) -> web.Response:
        return await self._answer(request, "filter", self._extender.filter)

    async def _prioritize(self, request: web.BaseRequest) -> web.Response:
        return await self._answer(request, "prioritize", self._extender.prioritize)

    async def _bind(self, request: web.BaseRequest) -> web.Response:
        return await self._answer(request, "bind", self._extender.bind)

    async def _answer(self, request: web.BaseRequest, name: str, verb: Any) -> web.Response:
        started = perf_counter()
        try:
            body = await self._serving.read_body(request)
            outcome = verb(body)
            if asyncio.iscoroutine(outcome):
                outcome = await outcome
        except BodyRefused as exc:
            self._metrics.observe(name, "bad_request", perf_counter() - started)
            return self._refuse(request, exc.message, exc.status)
        except BadArguments as exc:
            self._metrics.observe(name, "bad_request", perf_counter() - started)
            return self._refuse(request, str(exc))
        self._log_outcome(outcome)
        answer = web.Response(body=outcome.body, content_type="application/json")
        self._metrics.observe(name, "refused" if outcome.event == "bind_failed" else "ok",
                              perf_counter() - started)
        return answer

    def _refuse(self, request: web.BaseRequest, message: str, status: int = 400) -> web.Response:
        self._log.warning("bad_request", path=request.path, reason=message)
        return web.Response(status=status, text=f"bad extender request: {message}\n")

    def _log_outcome(self, outcome: Outcome) -> None:
        if outcome.event == "bind_failed":
            self._log.warning(outcome.event, **outcome.fields)
        elif outcome.event == "bound":
            self._log.info(outcome.event, **outcome.fields)

    async def _ok(self, _: web.BaseRequest) -> web.Response:
        return web.Response(text="ok\n")

    async def _ready(self, _: web.BaseRequest) -> web.Response:
        if self._watch.view.ready:
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not ready: the nodes are not listed yet (at start "
                                             "and after a watch error)\n")

    async def _metrics_text(self, _: web.BaseRequest) -> web.Response:
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vcuda-scheduler-extender",
        description="kube-scheduler extender of vcuda: keeps only the nodes where one GPU can "
                    "hold a pod's share (and enough GPUs are unused for its whole GPUs), scores "
                    "them, and at bind records the chosen GPUs in the node's GPU ledger and on "
                    "the pod. Serves POST /filter, /prioritize, /bind (extender API v1, "
                    "nodeCacheCapable: true: it watches the Nodes labelled "
                    "vcuda.io/enabled=true itself) and GET /healthz, /readyz (once the nodes "
                    "are listed) and /metrics (Prometheus). Logs JSON lines on stdout.")
    version_flag(parser)
    parser.add_argument("--host", default=None, help="address to listen on (default: all)")
    parser.add_argument("--port", type=tcp_port, default=DEFAULT_PORT,
                        help=f"port to listen on (default: {DEFAULT_PORT})")
    parser.add_argument("--metrics-port", type=tcp_port, metavar="PORT",
                        help="also serve GET /metrics (and /healthz) alone, over plain HTTP, on "
                             "this port, for Prometheus (default: no such port; /metrics is "
                             "served on --port too)")
    parser.add_argument("--metrics-host", default=None,
                        help="address of --metrics-port (default: all)")
    parser.add_argument("--strategy", choices=STRATEGIES, default="binpack",
                        help="binpack: fill the fullest GPU and node that fit (default); "
                             "spread: the emptiest")
    parser.add_argument("--max-age", type=positive_seconds, default=DEFAULT_MAX_AGE,
                        metavar="SECONDS",
                        help="a node whose agent last published its GPUs longer ago is left "
                             f"out (default: {DEFAULT_MAX_AGE:g}; the agent publishes every "
                             "--interval, 30 s by default)")
    parser.add_argument("--domain", action="append", metavar="DOMAIN",
                        help="resource domain of vcuda-core, repeatable (default: the "
                             "webhook's, docker.com and tencent.com)")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="credentials (default: the pod's service account)")
    parser.add_argument("--cert-file", type=Path,
                        help="serve HTTPS with this PEM certificate (reloaded when it changes)")
    parser.add_argument("--key-file", type=Path, help="the key of --cert-file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the extender until SIGINT or SIGTERM."""
    parser = _parser()
    args = parser.parse_args(argv)
    if bool(args.cert_file) != bool(args.key_file):
        parser.error("--cert-file and --key-file go together")
    try:
        config = Config(domains=tuple(args.domain)) if args.domain else Config()
    except ConfigError as exc:
        parser.error(f"--domain: {exc}")
    log = make_logger(sys.stdout.buffer)
    certificates = None
    if args.cert_file:
        try:
            certificates = CertificateReloader(args.cert_file, args.key_file, log)
        except CertificateError as exc:
            parser.error(str(exc))
    try:
        credentials = Credentials.load(args.kubeconfig)
    except KubeError as exc:
        parser.error(exc.message)
    core_keys = tuple(keys[1] for keys in config.vcuda_keys)
    # What is loaded by now lives as long as the process: the collector need not walk it
    # again on each full pass (decoding every request's pod makes many short-lived objects).
    gc.freeze()
    # libuv's loop: sockets, TLS and callbacks in C instead of asyncio's Python (about a tenth
    # of the CPU a pod costs, most of which is serving the scheduler and calling the API).
    uvloop.run(_serve(credentials, core_keys, args, certificates, log))
    return 0


async def _serve(credentials: Credentials, core_keys: tuple[str, ...], args: argparse.Namespace,
                 certificates: CertificateReloader | None, log: Any) -> None:
    kube = Kube(credentials)
    nodes = NodeView()
    binder = Binder(kube, nodes, core_keys, args.strategy, args.max_age)
    events = NodeEvents(kube, log)
    server = ExtenderServer(Extender(binder, nodes, core_keys, args.strategy, args.max_age,
                                     events=events),
                            NodeWatch(kube, nodes, log), log, certificates, events)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signal_number, stop.set)
    port = await server.start(args.host, args.port)
    metrics_port = None if args.metrics_port is None else \
        await server.start_metrics(args.metrics_host, args.metrics_port)
    log.info("serving", port=port, metrics_port=metrics_port, https=certificates is not None,
             strategy=args.strategy,
             loop=type(loop).__module__.partition(".")[0],
             max_age=args.max_age, api=credentials.url)
    await stop.wait()
    log.info("stopping")
    await server.stop()
    await kube.close()


if __name__ == "__main__":
    sys.exit(main())
