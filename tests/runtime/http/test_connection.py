"""Read deadlines and the connection cap, on a real uvicorn socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from fnrt.runtime import scheduler as sched
from fnrt.runtime.http.connection import (
    ConnectionLimits,
    OneWrite,
    connection_cap,
    guarded_protocol,
)
from support import (
    BATCH_OF_ONE_MANIFEST,
    LiveServer,
    gate,
    live_server,
    read_to_close,
    wait_until,
    write_function,
)

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


@pytest.fixture(params=[0.5])
def server(tmp_path: Path, request: pytest.FixtureRequest):
    """A server with short read deadlines (``request.param``) and a cap of 6 connections."""
    timeout_s = request.param
    limits = {"header_timeout_s": timeout_s, "body_timeout_s": timeout_s, "max_connections": 6}
    with live_server(tmp_path, **limits) as srv:
        for name, kwargs in (
            ("echo", {}),
            ("gated", {"handler": GATED, "manifest": BATCH_OF_ONE_MANIFEST}),
        ):
            folder = write_function(tmp_path / "src", name, **kwargs)
            srv.deploy(folder)
        yield srv
        gate("connections").set()


def connect(server: LiveServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def normal_request(server: LiveServer) -> int:
    with server.client() as c:
        return c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}).status_code


def test_a_request_head_sent_too_slowly_is_answered_408(server: LiveServer) -> None:
    with connect(server) as sock:
        for line in HEAD.split(b"\r\n")[:2]:  # a slowloris: part of a head, then nothing
            sock.sendall(line + b"\r\n")
            time.sleep(0.1)
        answer = read_to_close(sock)
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive in time" in answer
    assert normal_request(server) == 200


def test_a_connection_that_never_sends_is_closed(server: LiveServer) -> None:
    with connect(server) as sock:
        assert read_to_close(sock).startswith(b"HTTP/1.1 408")


def test_a_stalled_body_closes_the_connection(server: LiveServer) -> None:
    with connect(server) as sock:
        sock.sendall(HEAD + b"\r\n" + BODY[:5])  # the head, then 5 of its bytes, then nothing
        answer = read_to_close(sock)
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
    assert read_to_close(idle[0]) == b""
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
            answer = read_to_close(sock)
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
    folder = write_function(tmp_path / "src", "counted", COUNTED, manifest=BATCH_OF_ONE_MANIFEST)
    server.deploy(folder)
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
        wait_until(lambda: scheduler.batcher.queued == 4)
        open_before = server.open_connections()
        for sock in leaving:  # they give up while queued
            sock.close()
        wait_until(lambda: server.open_connections() == open_before - 4)  # the server saw it
        release.set()
        assert first.result().status_code == 200
        wait_until(lambda: scheduler.batcher.queued == 0 and not sched.activity(scheduler).busy)
        assert fnrt_test_gates.calls == [1]  # none of the 4 was computed (was 4 of 4)
        assert scheduler.stats.abandoned == 4
        r = c.post("/v1/functions/counted/invoke", json={"x": [[2.0]]})
        assert r.status_code == 200
        metrics = c.get("/metrics").text
    assert 'fnrt_requests_total{function="counted",status="499"' in metrics


# --- a minimum rate for bodies and answers, and whom the cap evicts ----------------------


def paced_server(tmp_path: Path, **limits: object) -> contextlib.AbstractContextManager[LiveServer]:
    """A server with ``echo`` deployed and the given connection limits."""

    @contextlib.contextmanager
    def serving() -> Iterator[LiveServer]:
        with live_server(tmp_path, **limits) as srv:
            folder = write_function(tmp_path / "src", "echo")
            srv.deploy(folder)
            yield srv

    return serving()


def slow_head(length: int) -> bytes:
    return (
        b"POST /v1/functions/echo/invoke HTTP/1.1\r\nhost: t\r\n"
        b"content-type: application/json\r\ncontent-length: " + str(length).encode() + b"\r\n\r\n"
    )


def protocols(server: LiveServer) -> list[Any]:
    return list(server._server.server_state.connections)


def test_a_body_under_the_minimum_rate_gets_408_saying_why(tmp_path: Path) -> None:
    limits = {"min_body_rate_bytes_s": 100, "body_rate_window_s": 0.5}
    with paced_server(tmp_path, **limits) as server, connect(server) as sock:
        sock.sendall(slow_head(1000) + b"{")
        started = time.monotonic()
        answer = b""
        sock.settimeout(0.1)
        while not answer and time.monotonic() - started < 10:  # a byte every 0.1 s: 10 B/s
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                sock.sendall(b" ")  # never a pause long enough for the 30 s body timeout
        sock.settimeout(10)
        answer += read_to_close(sock)
        took_s = time.monotonic() - started
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        error = json.loads(body)["error"]
        assert "bytes/s over 0.5 s" in error and "minimum of 100 bytes/s" in error, error
        assert "--min-body-rate-bytes-s" in error
        assert took_s < 2.0  # one window (0.5 s) and a sweep or two
        with server.client() as c:
            assert c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}).is_success
            metrics = c.get("/metrics").text
    assert 'status="408"' in metrics and 'status="499"' not in metrics  # logged as refused


def test_a_body_above_the_minimum_rate_is_served(tmp_path: Path) -> None:
    limits = {"min_body_rate_bytes_s": 100, "body_rate_window_s": 0.5}
    body = b'{"x": [[1, 2, 3, 4]]' + b" " * 600 + b"}"  # 622 bytes in 1.5 s: 400 bytes/s
    with paced_server(tmp_path, **limits) as server, connect(server) as sock:
        sock.sendall(slow_head(len(body)))
        for i in range(0, len(body), 40):
            sock.sendall(body[i : i + 40])
            time.sleep(0.1)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_a_body_the_server_is_slow_to_read_is_not_judged(tmp_path: Path) -> None:
    """Past 64 KiB uvicorn stops reading a body until the application asks for more:
    that time is the server's, not the client's. A 1 MiB body sent at once to an
    application that waits 1 s before reading is served, under a minimum of 1 MB/s
    judged every 0.25 s."""
    import asyncio

    import uvicorn

    async def late_reader(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await asyncio.sleep(1.0)  # busy elsewhere; reading is paused meanwhile
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(size).encode()})

    limits = ConnectionLimits(min_body_rate_bytes_s=1_000_000, body_rate_window_s=0.25)
    config = uvicorn.Config(
        late_reader, loop="uvloop", http=guarded_protocol(limits), log_level="warning"
    )
    server = uvicorn.Server(config)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        port = listening.getsockname()[1]
        thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]})
        thread.start()
        try:
            wait_until(lambda: server.started)
            body = b"x" * (1 << 20)
            r = httpx.post(f"http://127.0.0.1:{port}/", content=body, timeout=30)
        finally:
            server.should_exit = True
            thread.join(30)
    assert r.status_code == 200, r.text
    assert r.text == str(len(body))


def test_a_keep_alive_connection_is_not_evicted_while_slow_bodies_exist(tmp_path: Path) -> None:
    """At the cap, new connections close slow bodies (408, saying why), never the
    connection a behaving client keeps alive between two of its requests (it was the
    first to go: the only one not busy)."""
    limits = {"max_connections": 6, "min_body_rate_bytes_s": 500, "body_rate_window_s": 30}
    request = HEAD + b"\r\n" + BODY
    with paced_server(tmp_path, **limits) as server, connect(server) as kept:
        kept.sendall(request)  # a behaving client: a request, answered, then a pause
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        slow = [connect(server) for _ in range(5)]  # the cap: 6
        for sock in slow:
            sock.sendall(slow_head(1000) + b"{")
        pace = server.node.settings
        assert pace.min_body_rate_bytes_s == 500
        # each is judged slow once it has waited 0.5 s (the grace before a rate says anything)
        wait_until(
            lambda: sum(p._upload.waited_s >= 0.5 for p in protocols(server)) == 5,
            timeout_s=20,
        )
        clients = [server.client() for _ in range(3)]  # three new clients at the cap,
        for i, c in enumerate(clients):  # each kept alive: each closes a slow body
            r = c.post("/v1/functions/echo/invoke", json={"x": [[i, 1, 2, 3]]})
            assert r.status_code == 200
        kept.sendall(request)  # the kept-alive connection is still there
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        for c in clients:  # and theirs too
            assert c.post("/v1/functions/echo/invoke", json={"x": [[1, 1, 2, 3]]}).is_success
            c.close()
        answers = []
        for sock in slow:
            sock.settimeout(0.2)
            try:
                answers.append(sock.recv(65536))
            except TimeoutError:
                answers.append(b"")
            sock.close()
    evicted = [a for a in answers if a]
    assert len(evicted) == 3, answers
    for answer in evicted:
        assert answer.startswith(b"HTTP/1.1 408"), answer
        error = json.loads(answer.partition(b"\r\n\r\n")[2])["error"]
        assert "bytes/s" in error and "connection cap" in error


@pytest.mark.parametrize("server", [30.0], indirect=True)
def test_at_the_cap_a_silent_connection_goes_before_a_kept_alive_one(server: LiveServer) -> None:
    with connect(server) as kept:
        kept.sendall(HEAD + b"\r\n" + BODY)  # kept alive between requests, idle longest
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        silent = [connect(server) for _ in range(5)]  # the cap: 6; these never send a byte
        wait_until(lambda: server.open_connections() == 6)
        assert normal_request(server) == 200  # a 7th: a silent one goes
        assert read_to_close(silent[0]) == b""  # the oldest of them
        kept.sendall(HEAD + b"\r\n" + BODY)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        for sock in silent:
            sock.close()


def test_an_answer_the_client_never_takes_is_cut_off(tmp_path: Path) -> None:
    """A client that asks for a large answer and never reads it would hold its descriptor
    and the unsent answer's memory for ever: closing waits for the answer to leave."""
    import msgpack
    import msgpack_numpy

    limits = {"min_body_rate_bytes_s": 1000, "body_rate_window_s": 0.5, "header_timeout_s": 30}
    x = np.ones((1 << 21, 4), np.float32)  # 32 MiB each way
    body = msgpack.packb({"x": x}, default=msgpack_numpy.encode)
    head = (
        b"POST /v1/functions/echo/invoke HTTP/1.1\r\nhost: t\r\n"
        b"content-type: application/msgpack\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
    )
    with paced_server(tmp_path, **limits) as server:
        before = server.open_connections()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # takes little at a time
        sock.connect(("127.0.0.1", server.port))
        with sock:
            sock.sendall(head + body)  # and never reads the answer
            wait_until(lambda: any(p._sending for p in protocols(server)), timeout_s=30)
            started = time.monotonic()
            wait_until(lambda: server.open_connections() == before, timeout_s=10)
            assert time.monotonic() - started < 3.0  # a window (0.5 s) and a few sweeps
        assert normal_request(server) == 200


# --- data routes answered by the connection (connection.Answering) -----------------------


def exchange(sock: socket.socket, request: bytes, answers: int = 1) -> list[bytes]:
    """Send ``request`` and read ``answers`` whole responses (heads with a content-length)."""
    sock.sendall(request)
    buffered, out = b"", []
    while len(out) < answers:
        while b"\r\n\r\n" not in buffered:
            buffered += sock.recv(65536)
        head, _, rest = buffered.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 100"):
            buffered = rest
            continue
        length = int(next(h for h in head.split(b"\r\n") if h.startswith(b"content-length:"))[15:])
        while len(rest) < length:
            rest += sock.recv(65536)
        out.append(head + b"\r\n\r\n" + rest[:length])
        buffered = rest[length:]
    return out


def invoke_request(path: bytes, body: bytes, *headers: bytes) -> bytes:
    head = b"POST " + path + b" HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
    head += b"".join(h + b"\r\n" for h in headers)
    return head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def without_date(answer: bytes) -> bytes:
    return b"\r\n".join(line for line in answer.split(b"\r\n") if not line.startswith(b"date:"))


@pytest.mark.parametrize("path", [b"echo", b"nope"])
def test_a_data_route_answered_by_the_connection_is_what_the_app_answers(
    server: LiveServer, path: bytes
) -> None:
    """The connection answers an invoke itself (no ASGI dispatch): the same status,
    headers and body as the app gives the same request (a path with an escape goes
    through the app: the connection leaves those to it), answer or error."""
    with connect(server) as sock:
        exchange(sock, invoke_request(b"/v1/functions/" + path + b"/invoke", BODY))  # warm
        direct = exchange(sock, invoke_request(b"/v1/functions/" + path + b"/invoke", BODY))[0]
        cycles = {type(p.cycle).__name__ for p in protocols(server) if p.cycle is not None}
        escaped = b"/v1/functions/" + path[:-1] + b"%%%02x/invoke" % path[-1]
        through_app = exchange(sock, invoke_request(escaped, BODY))[0]
    assert "Answering" in cycles
    assert without_date(direct) == without_date(through_app)
    assert direct.startswith(b"HTTP/1.1 200" if path == b"echo" else b"HTTP/1.1 404")


def test_an_idle_kept_alive_connection_is_closed_without_a_word(tmp_path: Path) -> None:
    """Past the keep-alive time with no byte of a next request, the connection closes
    as uvicorn's keep-alive timer closes it (the sweep does it here): nothing more is
    written (no 408: the client asked nothing)."""
    with live_server(tmp_path, keep_alive_s=0.3, header_timeout_s=30.0) as srv:
        srv.deploy(write_function(tmp_path / "src", "echo"))
        with connect(srv) as sock:
            answer = exchange(sock, invoke_request(b"/v1/functions/echo/invoke", BODY))[0]
            assert answer.startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            assert read_to_close(sock) == b""  # closed, nothing written
            waited = time.monotonic() - started
        assert 0.25 <= waited < 5  # the keep-alive time (and a sweep), not the head's 30 s


def test_a_next_head_begun_is_held_to_the_head_deadline_not_the_keep_alive(
    tmp_path: Path,
) -> None:
    """A connection whose next request has begun to arrive is not idle: past the
    keep-alive time it is not closed; at the head's deadline it is answered 408."""
    with live_server(tmp_path, keep_alive_s=0.2, header_timeout_s=1.0) as srv:
        srv.deploy(write_function(tmp_path / "src", "echo"))
        with connect(srv) as sock:
            exchange(sock, invoke_request(b"/v1/functions/echo/invoke", BODY))
            sock.sendall(HEAD.split(b"\r\n")[0] + b"\r\n")  # the next head's first line
            started = time.monotonic()
            rest = read_to_close(sock)
            waited = time.monotonic() - started
        assert rest.startswith(b"HTTP/1.1 408") and waited >= 0.7


@pytest.mark.parametrize(
    ("target", "query"),
    [
        (b"/v1/functions/echo/invoke?trace=1&a=%20", b"trace=1&a=%20"),
        (b"/v1/functions/echo/invoke?", b""),
        (b"/v1/functions/echo/invoke?a?b", b"a?b"),
    ],
)
def test_a_query_on_a_data_route_is_answered_at_the_connection_with_its_query(
    server: LiveServer, target: bytes, query: bytes
) -> None:
    """The connection splits the path from the query itself (as httptools' parse_url
    does for a path that begins with a slash and has no fragment): the request is
    answered there, with the query in its scope."""
    with connect(server) as sock:
        answer = exchange(sock, invoke_request(target, BODY))[0]
        cycles = [p.cycle for p in protocols(server) if p.cycle is not None]
    assert answer.startswith(b"HTTP/1.1 200")
    assert [(type(c).__name__, c.scope["query_string"]) for c in cycles] == [("Answering", query)]


def test_pipelined_invokes_are_answered_in_order(server: LiveServer) -> None:
    requests = [
        invoke_request(b"/v1/functions/echo/invoke", b'{"x": [[%d, 0, 0, 0]]}' % i)
        for i in range(3)
    ]
    with connect(server) as sock:
        answers = exchange(sock, b"".join(requests), answers=3)
    bodies = [json.loads(a.partition(b"\r\n\r\n")[2]) for a in answers]
    assert [b["y"][0][0] for b in bodies] == [0, 2, 4]  # echo doubles


def test_an_invoke_that_expects_100_continue_gets_it_then_its_answer(server: LiveServer) -> None:
    head = invoke_request(b"/v1/functions/echo/invoke", BODY, b"expect: 100-continue")
    head = head[: -len(BODY)]
    with connect(server) as sock:
        sock.sendall(head)
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        answer = exchange(sock, BODY)[0]
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"y":[[2.0,4.0,6.0,8.0]]}')


def test_an_invoke_whose_body_comes_in_pieces_is_served(server: LiveServer) -> None:
    request = invoke_request(b"/v1/functions/echo/invoke", BODY)
    with connect(server) as sock:
        sock.sendall(request[:-5])
        time.sleep(0.05)  # the route waits on the rest: not all of it is there yet
        answer = exchange(sock, request[-5:])[0]
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"y":[[2.0,4.0,6.0,8.0]]}')


def test_other_methods_on_a_data_route_still_get_405(server: LiveServer) -> None:
    with server.client() as c:
        r = c.get("/v1/functions/echo/invoke")
    assert r.status_code == 405 and "POST" in r.headers["allow"]


# --- OneWrite: a turn's writes held to its end ---------------------------------------


class Recorded(asyncio.Transport):
    """A transport that records what reaches it, one entry a call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []
        self.closed = False

    def writelines(self, data: Any) -> None:
        self.calls.append(list(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


def test_writes_of_one_turn_leave_in_one_call_at_its_end() -> None:
    async def main() -> tuple[list[Any], list[Any], int]:
        transport = Recorded()
        one = OneWrite(transport, asyncio.get_running_loop())
        one.write(b"head")
        one.write(b"body")
        during = list(transport.calls)  # nothing yet: the turn has not ended
        await asyncio.sleep(0)
        return during, transport.calls, one.written

    during, after, written = asyncio.run(main())
    assert during == [] and after == [[b"head", b"body"]] and written == 8


def test_a_close_sends_what_is_held_first() -> None:
    async def main() -> Recorded:
        transport = Recorded()
        one = OneWrite(transport, asyncio.get_running_loop())
        one.write(b"answer")
        one.close()
        await asyncio.sleep(0)  # the flush scheduled for the turn's end finds nothing more
        return transport

    transport = asyncio.run(main())
    assert transport.calls == [[b"answer"]] and transport.closed


def test_the_writes_of_many_connections_in_a_turn_leave_at_its_end_each_in_one_call() -> None:
    """Connections sharing a server's list are flushed by one handle at the turn's end,
    each its own writes in one call, in the order they began; a write made in a later
    turn leaves at that turn's end."""

    async def main() -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        loop = asyncio.get_running_loop()
        flushing: list[OneWrite] = []
        a, b = Recorded(), Recorded()
        one_a, one_b = OneWrite(a, loop, flushing), OneWrite(b, loop, flushing)
        one_b.write(b"b-head")
        one_a.write(b"a-head")
        one_b.write(b"b-body")
        one_a.write(b"a-body")
        assert a.calls == [] and b.calls == [] and len(flushing) == 2
        await asyncio.sleep(0)
        first = (list(a.calls), list(b.calls))
        one_a.write(b"again")
        await asyncio.sleep(0)
        return first[0], first[1], a.calls, flushing

    first_a, first_b, later_a, left = asyncio.run(main())
    assert first_a == [[b"a-head", b"a-body"]] and first_b == [[b"b-head", b"b-body"]]
    assert later_a == [[b"a-head", b"a-body"], [b"again"]] and left == []


def test_a_connection_whose_write_fails_leaves_the_others_written() -> None:
    """One connection's write raising is logged; the turn's other connections are
    written all the same, and a later write schedules a flush again."""

    class Broken(Recorded):
        def writelines(self, data: Any) -> None:
            raise RuntimeError("broken")

    async def main() -> tuple[list[Any], list[Any]]:
        loop = asyncio.get_running_loop()
        flushing: list[OneWrite] = []
        broken, good = Broken(), Recorded()
        one_broken, one_good = OneWrite(broken, loop, flushing), OneWrite(good, loop, flushing)
        one_broken.write(b"lost")
        one_good.write(b"answer")
        await asyncio.sleep(0)
        one_good.write(b"next")
        await asyncio.sleep(0)
        return good.calls, flushing

    calls, left = asyncio.run(main())
    assert calls == [[b"answer"], [b"next"]] and left == []
