"""No client of the real TLS server takes it down: malformed bodies get a 400, slow or greedy
connections are closed, and each refusal is logged and counted."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.webhook.builders import pod, review, shared
from tests.webhook.conftest import LOOPS, RunningServer, SecretVolume, start_server
from tests.webhook.test_server import metric
from webhook import serving
from webhook.serving import Guards

FAST = Guards(max_connections=4, max_buffered=1 << 20, handshake_timeout=0.5,
              head_timeout=0.5, idle_timeout=2.0, body_timeout=0.5)
_REVIEW_HEAD = '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'


@pytest.fixture(params=list(LOOPS))  # each loop has its own TLS layer, which the guards wrap
def guarded(secret: SecretVolume, client_context: ssl.SSLContext, tmp_path: Path,
            request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    running = start_server(secret, client_context, tmp_path / "webhook.log", guards=FAST,
                           loop=request.param)
    yield running
    running.stop()


def _tls(server: RunningServer) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return server.client_context.wrap_socket(raw, server_hostname="127.0.0.1")


def _head(length: int | None, extra: str = "") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else ""
    return (f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"{size}{extra}\r\n").encode()


def _answer_then_close(sock: ssl.SSLSocket, within: float = 5) -> bytes:
    """Everything the server sends until it closes the connection; fails after ``within`` s."""
    sock.settimeout(within)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except (ConnectionResetError, ssl.SSLEOFError):
        pass
    return got


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed ``sock`` (fails if it stays open past ``seconds``)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    with contextlib.suppress(ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        assert sock.recv(1) == b""
    return time.monotonic() - started


def _metrics(server: RunningServer) -> str:
    status, body = server.request("GET", "/metrics")
    assert status == 200
    return body.decode()


# Nested deeper than any recursion limit a library in the process sets (celpy's: 2500).
@pytest.mark.parametrize(("body", "headers", "message"), [
    ((_REVIEW_HEAD + '{"uid":"\xff"}}').encode("latin-1"), {},
     f"bad AdmissionReview: body is not UTF-8: byte 0xff at offset {len(_REVIEW_HEAD) + 8}\n"),
    ((_REVIEW_HEAD + '{"uid":"u","object":' + '{"a":' * 5000 + "1" + "}" * 5002).encode(), {},
     "bad AdmissionReview: body is nested too deep to read\n"),
    (("[" * 5000 + "]" * 5000).encode(), {},
     "bad AdmissionReview: body is nested too deep to read\n"),
    (b"not gzip at all", {"Content-Encoding": "gzip"},
     "bad AdmissionReview: Content-Encoding 'gzip' is not accepted: send the body uncompressed\n"),
    (b"{}", {"Content-Encoding": "br"},
     "bad AdmissionReview: Content-Encoding 'br' is not accepted: send the body uncompressed\n"),
], ids=["invalid utf-8", "deep pod", "deep array", "gzip that is not", "brotli"])
def test_a_malformed_body_gets_a_one_line_400_is_logged_and_counted(
        server: RunningServer, body: bytes, headers: dict[str, str], message: str) -> None:
    status, answer = server.request("POST", "/mutate", body,
                                    {"Content-Type": "application/json", **headers})
    assert (status, answer.decode()) == (400, message)
    assert metric(_metrics(server), 'vcuda_webhook_reviews_total{decision="invalid"}') == 1
    reason = message.removeprefix("bad AdmissionReview: ").strip()
    logged = server.logs(lambda lines: any(line.get("reason") == reason for line in lines))
    assert [line["decision"] for line in logged if line.get("reason") == reason] == ["invalid"]
    assert server.review(review(pod(shared("train"))))["allowed"] is True


def test_connections_past_the_cap_are_closed_at_once_and_the_others_still_served(
        guarded: RunningServer) -> None:
    held = [_tls(guarded) for _ in range(FAST.max_connections)]
    for sock in held:  # the server has taken each one in: it answers a request on it
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    extra = socket.create_connection(("127.0.0.1", guarded.port), timeout=5)
    assert _closed_within(extra, 2) < 1  # at accept, before any TLS
    for sock in held:
        sock.close()
    time.sleep(0.1)
    assert guarded.review(review(pod(shared("train"))))["allowed"] is True
    closed = 'vcuda_webhook_connections_closed_total{reason="connection_limit"}'
    assert metric(_metrics(guarded), closed) == 1


def test_a_connection_that_never_finishes_its_head_is_closed_after_the_deadline(
        guarded: RunningServer) -> None:
    sock = _tls(guarded)
    sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    waited = _closed_within(sock, 5)
    assert FAST.head_timeout <= waited < FAST.head_timeout + 1.5
    closed = 'vcuda_webhook_connections_closed_total{reason="head_timeout"}'
    assert metric(_metrics(guarded), closed) == 1
    logged = guarded.logs(lambda lines: any(line.get("event") == "connection_closed"
                                            for line in lines))
    assert any(line.get("reason") == "head_timeout" for line in logged)


def test_a_kept_alive_connection_waits_its_idle_deadline_not_the_head_one_and_is_no_attack(
        guarded: RunningServer) -> None:
    """Kept alive past the head deadline, as the API server's pool expects (it closes its
    idle connections first), then closed at the idle deadline without counting as a guard."""
    sock = _tls(guarded)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    # From the answer's end as the server sees it, which the client sees a moment later:
    # well past the head deadline, and by the idle one.
    assert FAST.head_timeout + 1 < _closed_within(sock, 6) < FAST.idle_timeout + 1.5
    closed = 'vcuda_webhook_connections_closed_total{reason="head_timeout"}'
    assert metric(_metrics(guarded), closed) == 0


def test_a_kept_alive_connection_still_answers_after_the_head_deadline(
        guarded: RunningServer) -> None:
    sock = _tls(guarded)
    for _ in range(2):
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(FAST.head_timeout + 0.5)
    sock.close()


def test_a_bare_tcp_connection_without_a_handshake_is_closed_after_the_deadline(
        guarded: RunningServer) -> None:
    started = time.monotonic()  # before the connect: the server's deadline runs from accept
    raw = socket.create_connection(("127.0.0.1", guarded.port), timeout=5)
    _closed_within(raw, 5)
    assert FAST.handshake_timeout <= time.monotonic() - started < FAST.handshake_timeout + 1.5


def test_connections_still_in_their_handshake_count_against_the_cap(
        guarded: RunningServer) -> None:
    bare = [socket.create_connection(("127.0.0.1", guarded.port), timeout=5)
            for _ in range(FAST.max_connections)]
    time.sleep(0.1)
    extra = socket.create_connection(("127.0.0.1", guarded.port), timeout=5)
    assert _closed_within(extra, 2) < FAST.handshake_timeout  # not left to its deadline
    for sock in bare:
        sock.close()


def test_connections_that_drop_or_fail_their_handshake_give_their_place_back(
        guarded: RunningServer) -> None:
    dropped = [socket.create_connection(("127.0.0.1", guarded.port), timeout=5)
               for _ in range(FAST.max_connections // 2)]
    for sock in dropped:
        sock.close()
    failed = [socket.create_connection(("127.0.0.1", guarded.port), timeout=5)
              for _ in range(FAST.max_connections - len(dropped))]
    for sock in failed:  # plain HTTP where a TLS ClientHello is due
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _closed_within(sock, 2) < FAST.handshake_timeout
        sock.close()
    time.sleep(0.1)
    held = [_tls(guarded) for _ in range(FAST.max_connections)]
    for sock in held:  # the whole cap is free again
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.close()
    closed = 'vcuda_webhook_connections_closed_total{reason="connection_limit"}'
    time.sleep(0.1)
    assert metric(_metrics(guarded), closed) == 0


def test_a_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closed(
        guarded: RunningServer) -> None:
    sock = _tls(guarded)
    sock.sendall(_head(1000) + b'{"apiVersion"')
    answer = _answer_then_close(sock)
    assert answer.startswith(b"HTTP/1.1 408")
    assert answer.endswith(b"not reviewed: the body did not arrive within 0.5 s\n")
    text = _metrics(guarded)
    assert metric(text, 'vcuda_webhook_reviews_total{decision="refused"}') == 1
    assert metric(text, 'vcuda_webhook_connections_closed_total{reason="body_timeout"}') == 1


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_bodies_past_the_buffer_cap_get_503_and_the_held_bytes_are_given_back(
        secret: SecretVolume, client_context: ssl.SSLContext, tmp_path: Path,
        chunked: bool) -> None:
    guards = Guards(max_buffered=1 << 20, body_timeout=10)
    guarded = start_server(secret, client_context, tmp_path / "webhook.log", guards=guards)
    try:
        _hold_and_refuse(guarded, chunked)
    finally:
        guarded.stop()


def _hold_and_refuse(guarded: RunningServer, chunked: bool) -> None:
    holder = _tls(guarded)  # counts 2 x 400 KiB of the 1 MiB cap while its body trickles in
    holder.sendall(_head(400 << 10, "Connection: close\r\n") + b" " * 1024)
    time.sleep(0.1)
    greedy = _tls(guarded)
    if chunked:
        greedy.sendall(_head(None, "Transfer-Encoding: chunked\r\n")
                       + b"%x\r\n" % (200 << 10) + b" " * (200 << 10) + b"\r\n")
    else:
        greedy.sendall(_head(200 << 10))
    answer = _answer_then_close(greedy)
    assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
    assert b"not reviewed: the server holds " in answer
    holder.sendall(b" " * ((400 << 10) - 1024))  # whitespace: then a 400, and the bytes freed
    assert _answer_then_close(holder).startswith(b"HTTP/1.1 400")
    status, _ = guarded.post(json.dumps(review(pod(shared("train")))).encode())
    assert status == 200


class _Warnings:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def warning(self, event: str, **fields: object) -> None:
        self.lines.append((event, fields))


@pytest.mark.parametrize(("soft", "hard", "wanted", "now", "warned"), [
    (1024, 1 << 20, 4160, 4160, False),  # raised as far as wanted
    (1024, 2048, 4160, 2048, True),  # only as far as the hard limit: said so
    (8192, 1 << 20, 4160, 8192, False),  # enough already: left alone
])
def test_the_open_file_limit_is_raised_for_the_connections_allowed(
        monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, wanted: int, now: int,
        warned: bool) -> None:
    limits = [(soft, hard)]
    monkeypatch.setattr(serving.resource, "getrlimit", lambda _: limits[-1])
    monkeypatch.setattr(serving.resource, "setrlimit", lambda _, new: limits.append(new))
    log = _Warnings()
    assert serving.allow_open_files(wanted, log) == now
    assert limits[-1] == (now, hard)
    assert [event for event, _ in log.lines] == (["open_file_limit"] if warned else [])
