"""A data request whose body is all here is served with no task of its own
(``data.serve_now``), on a real uvicorn socket: which requests take that way, which
hand the rest to a task, and that each is answered as the task would answer it."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from fnrt.runtime.http import data
from fnrt.runtime.http.connection import GuardedProtocol
from support import LiveServer, live_server, read_to_close, write_function

BODY = b'{"x": [[1, 2, 3, 4]]}'
DOUBLED = b'{"y":[[2.0,4.0,6.0,8.0]]}'  # the echo handler answers 2x


def head(body: bytes, name: str = "echo", *extra: bytes) -> bytes:
    lines = [
        b"POST /v1/functions/" + name.encode() + b"/invoke HTTP/1.1",
        b"host: t",
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        *extra,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Starts:
    """How the connection started its data requests: with a task at once (``asgi``), or
    served now and, where a step had to wait, the rest on a task (``spawned``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asgi = 0
        self.spawned = 0
        start, spawn = GuardedProtocol._start_asgi_task, GuardedProtocol._spawn

        def counted_start(protocol: GuardedProtocol, cycle: object, app: object) -> None:
            if isinstance(app, data.Bound):  # the route itself (a spawned rest is not)
                self.asgi += 1
            start(protocol, cycle, app)  # type: ignore[arg-type]

        def counted_spawn(protocol: GuardedProtocol, cycle: object, coroutine: object) -> None:
            self.spawned += 1
            spawn(protocol, cycle, coroutine)  # type: ignore[arg-type]

        monkeypatch.setattr(GuardedProtocol, "_start_asgi_task", counted_start)
        monkeypatch.setattr(GuardedProtocol, "_spawn", counted_spawn)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("serve-now")
    with live_server(tmp) as srv:
        srv.deploy(write_function(tmp / "src", "echo"))
        srv.deploy(write_function(tmp / "src", "cold"))
        with srv.client() as c:  # echo's instance loaded: its requests need no wait
            assert c.post("/v1/functions/echo/invoke", content=BODY).status_code == 200
        yield srv


def exchange(server: LiveServer, *parts: bytes, pause_s: float = 0.0) -> bytes:
    """Send ``parts`` on one connection (``pause_s`` between them) and read to its close."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for i, part in enumerate(parts):
            if i:
                time.sleep(pause_s)
            sock.sendall(part)
        return read_to_close(sock)


def test_a_warm_request_whose_body_came_whole_runs_no_task(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = Starts(monkeypatch)
    answer = exchange(server, head(BODY, "echo", b"connection: close") + BODY)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    assert b"x-fnrt-function: echo\r\n" in answer
    assert answer.endswith(DOUBLED)
    assert (starts.asgi, starts.spawned) == (0, 0)


def test_a_body_still_arriving_is_read_by_a_task(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = Starts(monkeypatch)
    request = head(BODY, "echo", b"connection: close")
    answer = exchange(server, request + BODY[:5], BODY[5:], pause_s=0.2)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    assert answer.endswith(DOUBLED)
    assert (starts.asgi, starts.spawned) == (1, 0)


def test_a_cold_start_is_served_now_too(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version is routed here, its instance not loaded: the call waits in the queue
    for the load, its answer written from its future all the same."""
    starts = Starts(monkeypatch)
    answer = exchange(server, head(BODY, "cold", b"connection: close") + BODY)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    assert b"x-fnrt-cold-start: " in answer  # it waited for the load, and says so
    assert (starts.asgi, starts.spawned) == (0, 0)


def test_a_function_not_routed_here_yet_is_chosen_on_a_task(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = Starts(monkeypatch)
    monkeypatch.setattr(server.node.gateway, "choose_now", lambda target: None)
    answer = exchange(server, head(BODY, "echo", b"connection: close") + BODY)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    assert answer.endswith(DOUBLED)
    assert (starts.asgi, starts.spawned) == (0, 1)


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b'{"x": [[1, 2, 3]]}', b"422", b"expected shape"),  # checked against the version
        (b'{"x": [[1, 2, 3, 4]', b"400", b"JSON"),  # not JSON
    ],
)
def test_an_error_found_now_is_answered_as_a_task_answers_it(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch, body: bytes, status: bytes, error: bytes
) -> None:
    starts = Starts(monkeypatch)
    answer = exchange(server, head(body, "echo", b"connection: close") + body)
    assert answer.startswith(b"HTTP/1.1 " + status), answer
    assert b"content-type: application/json\r\n" in answer
    assert error in answer
    assert starts.asgi == 0 and starts.spawned == 1
    with server.client() as c:  # and the node goes on serving
        assert c.post("/v1/functions/echo/invoke", content=BODY).status_code == 200


def test_pipelined_requests_are_answered_in_order(server: LiveServer) -> None:
    bodies = [b'{"x": [[%d, 0, 0, 0]]}' % i for i in range(4)]
    requests = [head(b, "echo") + b for b in bodies[:-1]]
    requests.append(head(bodies[-1], "echo", b"connection: close") + bodies[-1])
    answer = exchange(server, b"".join(requests))
    answers = answer.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b"\r\n")[0] for a in answers] == [b"200 OK"] * 4
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [
        b'{"y":[[%d.0,0.0,0.0,0.0]]}' % (2 * i) for i in range(4)
    ]


def test_a_client_gone_before_its_answer_leaves_the_node_serving(server: LiveServer) -> None:
    for _ in range(20):  # each one closes as soon as it has sent its request
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head(BODY) + BODY)
    with server.client() as c:
        assert c.post("/v1/functions/echo/invoke", content=BODY).status_code == 200


def test_an_answer_behind_one_the_client_has_not_taken_waits_for_it(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client sends its next request without reading a large answer: the next
    answer cannot be written while the one before fills the connection's buffer (its
    writes are paused). It waits for the client on a task, then goes out whole, after it."""
    starts = Starts(monkeypatch)
    rows = 300_000  # an answer of about 5 MB: more than the kernel's buffers hold
    big = b'{"x": [' + b",".join([b"[1, 2, 3, 4]"] * rows) + b"]}"
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect
        sock.settimeout(30)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(head(big) + big)
        time.sleep(1.0)  # its answer is written, and most of it waits
        sock.sendall(head(BODY, "echo", b"connection: close") + BODY)
        time.sleep(0.5)
        answer = read_to_close(sock)
    first, second = answer.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert first.count(b"[2.0,4.0,6.0,8.0]") == rows
    assert second.endswith(DOUBLED)
    # the first, its body arriving over several reads, was read by a task; the second
    # was served now, and its write waited on a task
    assert (starts.asgi, starts.spawned) == (1, 1)


@pytest.mark.parametrize("failing", ["open_request", "write_now"])
def test_a_fault_of_the_server_s_own_is_answered_500_not_left_hanging(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """A bug raising where no route's error handling reaches (before the request is
    opened, or as its answer is written): answered 500 as uvicorn answers an app's
    error, on the task the rest goes to, and the node goes on serving."""

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(data, failing, broken)
    answer = exchange(server, head(BODY, "echo", b"connection: close") + BODY)
    assert answer.startswith(b"HTTP/1.1 500 "), answer
    monkeypatch.undo()
    with server.client() as c:
        assert c.post("/v1/functions/echo/invoke", content=BODY).status_code == 200
