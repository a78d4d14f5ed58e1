"""Read deadlines and the connection cap, on a real uvicorn socket."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fnrt.runtime.http.connection import connection_cap
from support import LiveServer, gate, live_server, publish, wait_until, write_function

BODY = b'{"x": [[1, 2, 3, 4]]}'
HEAD = (
    b"POST /v1/functions/echo/invoke HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(BODY)).encode() + b"\r\n"
)
GATED = """
import fnrt_test_gates

def handle(batch):
    fnrt_test_gates.gate("connections").wait(30)
    return [{"y": r["x"]} for r in batch]
"""
GATED_MANIFEST = """
name = "{name}"
handler = "handler:handle"

[batching]
max_batch_size = 1
"""


@pytest.fixture(params=[0.5])
def server(tmp_path: Path, request: pytest.FixtureRequest):
    """A server with short read deadlines (``request.param``) and a cap of 6 connections."""
    timeout_s = request.param
    limits = {"header_timeout_s": timeout_s, "body_timeout_s": timeout_s, "max_connections": 6}
    with live_server(tmp_path, **limits) as srv:
        for name, kwargs in (
            ("echo", {}),
            ("gated", {"handler": GATED, "manifest": GATED_MANIFEST}),
        ):
            folder = write_function(tmp_path / "src", name, **kwargs)
            srv.call(srv.node.deployer.deploy(publish(srv.node.repository, folder)))
        yield srv
        gate("connections").set()


def connect(server: LiveServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (bounded by the socket's timeout)."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def normal_request(server: LiveServer) -> int:
    with server.client() as c:
        return c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}).status_code


def test_a_request_head_sent_too_slowly_is_answered_408(server: LiveServer) -> None:
    with connect(server) as sock:
        for line in HEAD.split(b"\r\n")[:2]:  # a slowloris: part of a head, then nothing
            sock.sendall(line + b"\r\n")
            time.sleep(0.1)
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive in time" in answer
    assert normal_request(server) == 200


def test_a_connection_that_never_sends_is_closed(server: LiveServer) -> None:
    with connect(server) as sock:
        assert read_all(sock).startswith(b"HTTP/1.1 408")


def test_a_stalled_body_closes_the_connection(server: LiveServer) -> None:
    with connect(server) as sock:
        sock.sendall(HEAD + b"\r\n" + BODY[:5])  # the head, then 5 of its bytes, then nothing
        answer = read_all(sock)
        assert answer.startswith(b"HTTP/1.1 408") and b"stalled" in answer
    assert normal_request(server) == 200


def test_a_slow_body_that_keeps_moving_is_served(server: LiveServer) -> None:
    with connect(server) as sock:
        sock.sendall(HEAD + b"\r\n")
        for i in range(0, len(BODY), 4):  # 6 pauses of 0.2 s: longer in all than 0.5 s
            time.sleep(0.2)
            sock.sendall(BODY[i : i + 4])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("server", [30.0], indirect=True)  # no deadline passes here
def test_at_the_cap_a_new_connection_closes_the_longest_idle(server: LiveServer) -> None:
    idle = [connect(server) for _ in range(6)]  # the cap: all idle, none has sent a byte
    assert normal_request(server) == 200  # a 7th connection: the oldest idle one goes
    assert read_all(idle[0]) == b""
    idle[1].sendall(HEAD + b"\r\n" + BODY)  # the others are still open
    assert idle[1].recv(65536).startswith(b"HTTP/1.1 200")
    for sock in idle:
        sock.close()


@pytest.mark.parametrize("server", [30.0], indirect=True)
def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503(server: LiveServer) -> None:
    release = gate("connections")
    with ThreadPoolExecutor(6) as pool:
        body = {"x": [[1.0]]}

        def busy() -> int:
            with server.client() as c:
                return c.post("/v1/functions/gated/invoke", json=body).status_code

        held = [pool.submit(busy) for _ in range(6)]
        scheduler = server.call(server.registry.get("gated"))
        wait_until(lambda: scheduler.stats.requests == 6)
        with connect(server) as sock:
            answer = read_all(sock)
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"retry-after: 1" in answer
        release.set()
        assert [f.result() for f in held] == [200] * 6
    assert normal_request(server) == 200


def test_the_cap_leaves_descriptors_in_reserve() -> None:
    assert connection_cap(None, 1024, 256) == 768
    assert connection_cap(5000, 1024, 256) == 768
    assert connection_cap(100, 1024, 256) == 100
    assert connection_cap(None, 100, 256) == 16  # a floor, for tiny limits


COUNTED = """
import fnrt_test_gates

def handle(batch):
    fnrt_test_gates.calls.append(len(batch))
    fnrt_test_gates.gate("abandon").wait(30)
    return [{"y": r["x"]} for r in batch]
"""


@pytest.mark.parametrize("server", [30.0], indirect=True)
def test_a_request_whose_client_left_is_dropped_before_compute(
    tmp_path: Path, server: LiveServer
) -> None:
    import fnrt_test_gates  # type: ignore[import-not-found]

    fnrt_test_gates.calls = []
    folder = write_function(tmp_path / "src", "counted", COUNTED, manifest=GATED_MANIFEST)
    server.call(server.node.deployer.deploy(publish(server.node.repository, folder)))
    release = gate("abandon")
    scheduler = None
    with ThreadPoolExecutor(1) as pool, server.client() as c:
        first = pool.submit(c.post, "/v1/functions/counted/invoke", json={"x": [[0.0]]})
        scheduler = server.call(server.registry.get("counted"))
        wait_until(lambda: fnrt_test_gates.calls == [1])  # the handler holds the first
        body = b'{"x": [[1.0]]}'
        head = (
            b"POST /v1/functions/counted/invoke HTTP/1.1\r\nhost: t\r\n"
            b"content-type: application/json\r\ncontent-length: 14\r\n\r\n"
        )
        leaving = [connect(server) for _ in range(4)]  # the cap is 6: the test's 2 + 4
        for sock in leaving:
            sock.sendall(head + body)
        wait_until(lambda: scheduler.queued == 4)
        open_before = server.open_connections()
        for sock in leaving:  # they give up while queued
            sock.close()
        wait_until(lambda: server.open_connections() == open_before - 4)  # the server saw it
        release.set()
        assert first.result().status_code == 200
        wait_until(lambda: scheduler.queued == 0 and not scheduler.activity().busy)
        assert fnrt_test_gates.calls == [1]  # none of the 4 was computed (was 4 of 4)
        assert scheduler.stats.abandoned == 4
        r = c.post("/v1/functions/counted/invoke", json={"x": [[2.0]]})
        assert r.status_code == 200
        metrics = c.get("/metrics").text
    assert 'fnrt_requests_total{function="counted",status="499"' in metrics
