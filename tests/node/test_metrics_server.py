"""The metrics endpoint's HTTP server under clients that open connections and send little or
nothing: connections and threads stay bounded, slow heads are closed, a scrape is answered."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_hook.node import http_serving
from runtime_hook.node.http_serving import Limits
from runtime_hook.node.logs import Problems
from runtime_hook.node.nvml import Nvml
from runtime_hook.node.observe import Observer
from tests.node.fake_pynvml import GIB, FakeDevice, FakeNvml
from tests.node.workloads_on_host import Endpoint, labels

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"


def _endpoint(tmp_path: Path, limits: Limits | None = None) -> Endpoint:
    observer = Observer(Nvml(FakeNvml([FakeDevice(GPU0, 16 * GIB)])),
                        Problems(logging.getLogger("vcuda-node"), "metrics"), "/",
                        str(tmp_path / "state"))
    return Endpoint(observer, "gpu-node-1", limits)


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    running = _endpoint(tmp_path)
    yield running
    running.stop()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (None: still open after ``seconds``)."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def _wait_for(condition: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def _scraped(endpoint: Endpoint) -> float:
    """Scrape once; return the seconds it took."""
    start = time.monotonic()
    series = endpoint.scrape()
    assert series["vcuda_gpu_memory_total_bytes"] == {
        labels(node="gpu-node-1", gpu="0", uuid=GPU0): 16 * GIB}
    return time.monotonic() - start


def test_hundreds_of_idle_connections_hold_few_threads_and_a_scrape_is_answered(
        endpoint: Endpoint) -> None:
    before = threading.active_count()
    port = endpoint.server.server_port
    idle = [_connect(port) for _ in range(372)]
    try:
        time.sleep(0.5)  # the server accepts each of them meanwhile
        bound = 2 * http_serving.MAX_CONNECTIONS
        assert threading.active_count() - before <= bound
        assert endpoint.server.connections() <= bound
        assert _scraped(endpoint) < 2.0  # a waiting connection made room for it
        assert threading.active_count() - before <= bound
        # The idle ones still held are closed at their deadline.
        assert _wait_for(lambda: endpoint.server.connections() == 0,
                         http_serving.IDLE_TIMEOUT + 3)
        assert all(_closed_within(sock, 1.0) is not None for sock in idle)
    finally:
        for sock in idle:
            sock.close()
    assert _scraped(endpoint) < 2.0


def test_a_request_head_sent_a_byte_at_a_time_is_closed_at_the_header_deadline(
        tmp_path: Path) -> None:
    running = _endpoint(tmp_path, Limits(idle=1.0, header=2.0))
    try:
        sock = _connect(running.server.server_port)
        start = time.monotonic()
        closed = False
        try:
            for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:
                sock.sendall(bytes([byte]))
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            closed = True
        assert closed or _closed_within(sock, 3.0) is not None
        assert 1.9 <= time.monotonic() - start < 4.0
        sock.close()
        assert _scraped(running) < 2.0
    finally:
        running.stop()


def test_a_connection_that_sends_nothing_is_closed_at_the_idle_deadline(
        tmp_path: Path) -> None:
    running = _endpoint(tmp_path, Limits(idle=0.5, header=5.0))
    try:
        with _connect(running.server.server_port) as sock:
            waited = _closed_within(sock, 3.0)
        assert waited is not None and 0.4 <= waited < 2.0
    finally:
        running.stop()


def test_a_request_head_over_the_bound_is_closed(endpoint: Endpoint) -> None:
    with _connect(endpoint.server.server_port) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (64 << 10))
        assert _closed_within(sock, 2.0) is not None
    assert _wait_for(lambda: endpoint.server.connections() == 0, 2.0)


def test_when_every_connection_is_being_answered_a_new_one_is_closed_at_once(
        tmp_path: Path) -> None:
    running = _endpoint(tmp_path, Limits(max_connections=2, idle=5.0, header=5.0))
    server = running.server
    try:
        # Two connections whose heads are complete, held while they are answered.
        held = threading.Event()
        answering = threading.Semaphore(0)
        app = server.get_app()

        def slow_app(environ: dict, start_response: object) -> list[bytes]:
            answering.release()
            held.wait(10)
            return app(environ, start_response)  # type: ignore[no-any-return]

        server.set_app(slow_app)
        busy = [_connect(server.server_port) for _ in range(2)]
        for sock in busy:
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        # Both heads read and being answered: open but still reading, one would
        # rightly be closed to make room for the new connection.
        assert all(answering.acquire(timeout=10) for _ in busy)
        with _connect(server.server_port) as extra:
            assert _closed_within(extra, 2.0) is not None
        held.set()
        for sock in busy:
            sock.settimeout(5)
            assert sock.recv(12).startswith(b"HTTP/1.0 200")
            sock.close()
    finally:
        running.stop()
