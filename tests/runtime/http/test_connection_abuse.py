"""The data routes answered by the connection (``connection.Answering``), abused over a
real socket: malformed framing, lying lengths, pipelines with a bad request in the middle,
clients that leave, heads that never end, requests while the node drains.

Each case asserts the status, the error body naming what was wrong, that the server
serves the next normal request, and, where the app serves the same request (a path with
a percent-escape goes through the ASGI app: the connection leaves those to it), that
both answer alike.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from fnrt.runtime.http.app import build_app, connection_limits, data_apps
from fnrt.runtime.http.connection import guarded_protocol
from support import (
    BATCH_OF_ONE_MANIFEST,
    LiveServer,
    gate,
    make_node,
    publish,
    read_to_close,
    wait_until,
    write_function,
)

BODY = b'{"x": [[1, 2, 3, 4]]}'
ANSWER = b'{"y":[[2.0,4.0,6.0,8.0]]}'
DIRECT = b"/v1/functions/echo/invoke"
THROUGH_APP = b"/v1/functions/ech%6f/invoke"  # an escape: the ASGI app answers it
LIMIT = 4096  # max_body_bytes (msgpack); JSON's is 2048
GATED = """
import fnrt_test_gates

def handle(batch):
    fnrt_test_gates.calls.append(len(batch))
    fnrt_test_gates.gate("abuse").wait(30)
    return [{"y": r["x"]} for r in batch]
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """``echo`` and ``gated`` on a live server whose connections see the node's phase
    (``draining``), as ``fnrt serve``'s do, with small body limits."""
    node = make_node(
        tmp_path, header_timeout_s=5, max_body_bytes=LIMIT, max_json_body_bytes=LIMIT // 2
    )
    app = build_app(node.settings, node)
    srv = LiveServer(app)
    limits = connection_limits(node.settings)
    srv._server.config.http = guarded_protocol(limits, node.lifecycle, data_apps(app))
    srv.start()
    try:
        for name, kwargs in (
            ("echo", {}),
            ("gated", {"handler": GATED, "manifest": BATCH_OF_ONE_MANIFEST}),
        ):
            folder = write_function(tmp_path / "src", name, **kwargs)
            srv.call(node.deployer.deploy(publish(node.repository, folder)))
        with connect(srv) as sock:  # warm: later answers carry no cold-start header
            assert exchange(sock, request())[0].startswith(b"HTTP/1.1 200")
        yield srv
    finally:
        gate("abuse").set()
        if srv.loop is not None and not srv.loop.is_closed():  # (a test may have stopped it)
            srv.stop()


# --- talking to it -----------------------------------------------------------------------


def connect(server: LiveServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def request(
    path: bytes = DIRECT,
    body: bytes = BODY,
    *headers: bytes,
    length: bool = True,
    version: bytes = b"1.1",
    media_type: bytes = b"application/json",
) -> bytes:
    head = b"POST " + path + b" HTTP/" + version + b"\r\nhost: t\r\ncontent-type: " + media_type
    head += b"\r\n" + b"".join(h + b"\r\n" for h in headers)
    if length:
        head += b"content-length: %d\r\n" % len(body)
    return head + b"\r\n" + body


def chunked(body: bytes, *pieces: int, trailer: bytes = b"") -> bytes:
    """``body`` as a chunked body cut at ``pieces`` (offsets), then its trailer fields."""
    cuts = [0, *pieces, len(body)]
    out = b"".join(
        b"%x\r\n%s\r\n" % (end - start, body[start:end]) for start, end in itertools.pairwise(cuts)
    )
    return out + b"0\r\n" + trailer + b"\r\n"


def exchange(sock: socket.socket, data: bytes, answers: int = 1) -> list[bytes]:
    """Send ``data`` and read ``answers`` whole responses (heads with a content-length;
    ``100 Continue`` skipped)."""
    sock.sendall(data)
    return read_answers(sock, answers)


def read_answers(sock: socket.socket, answers: int, buffered: bytes = b"") -> list[bytes]:
    out: list[bytes] = []
    while len(out) < answers:
        while b"\r\n\r\n" not in buffered:
            more = sock.recv(65536)
            if not more:
                raise AssertionError(f"closed after {len(out)} answers: {out!r} {buffered!r}")
            buffered += more
        head, _, rest = buffered.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 100"):
            buffered = rest
            continue
        length = int(header(head + b"\r\n\r\n", b"content-length"))
        while len(rest) < length:
            rest += sock.recv(65536)
        out.append(head + b"\r\n\r\n" + rest[:length])
        buffered = rest[length:]
    assert buffered == b"", buffered
    return out


def status(answer: bytes) -> int:
    return int(answer[9:12])


def header(answer: bytes, name: bytes) -> bytes:
    head = answer.partition(b"\r\n\r\n")[0]
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.lower() == name:
            return value.strip()
    raise KeyError(name)


def body_of(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[2]


def error(answer: bytes) -> str:
    """The error an answer names, from its JSON or msgpack body."""
    media_type = header(answer, b"content-type")
    if media_type == b"application/msgpack":
        message: str = msgpack.unpackb(body_of(answer))["error"]
    else:
        assert media_type == b"application/json", answer
        message = json.loads(body_of(answer))["error"]
    return message


def without_date(answer: bytes) -> bytes:
    return b"\r\n".join(line for line in answer.split(b"\r\n") if not line.startswith(b"date:"))


def serves_normally(server: LiveServer) -> None:
    """A normal invoke on a new connection gets its answer."""
    with connect(server) as sock:
        answer = exchange(sock, request())[0]
    assert status(answer) == 200 and body_of(answer) == ANSWER, answer


def both_paths(server: LiveServer, make: object, answers: int = 1) -> list[bytes]:
    """The answers to ``make(path)`` sent on the direct path and through the app, each on a
    connection of its own: asserted alike (less their dates); the direct ones."""
    assert callable(make)
    out = []
    for path in (DIRECT, THROUGH_APP):
        with connect(server) as sock:
            out.append([without_date(a) for a in exchange(sock, make(path), answers)])
    assert out[0] == out[1]
    return out[0]


# --- framing: chunked bodies, lying lengths, both lengths -------------------------------


@pytest.mark.parametrize("pieces", [(), (3, 9, 10)])
def test_a_chunked_body_is_served_as_the_same_body_with_a_length(
    server: LiveServer, pieces: tuple[int, ...]
) -> None:
    answers = both_paths(
        server,
        lambda path: request(
            path, chunked(BODY, *pieces), b"transfer-encoding: chunked", length=False
        ),
    )
    assert status(answers[0]) == 200 and body_of(answers[0]) == ANSWER
    with connect(server) as sock:  # the chunks in separate segments: the route waits on them
        sock.sendall(request(DIRECT, b"", b"transfer-encoding: chunked", length=False))
        for chunk in chunked(BODY, 3, 9).split(b"\r\n")[:-1]:
            time.sleep(0.02)
            sock.sendall(chunk + b"\r\n")
        answer = exchange(sock, b"\r\n")[0]
    assert status(answer) == 200 and body_of(answer) == ANSWER


def test_a_chunked_body_over_the_limit_is_refused_413_and_the_connection_serves_on(
    server: LiveServer,
) -> None:
    big = b'{"x": [[1, 2, 3, 4]], "pad": "' + b"a" * LIMIT + b'"}'
    answers = both_paths(
        server,
        lambda path: (
            request(path, chunked(big, 100, 2000), b"transfer-encoding: chunked", length=False)
            + request(path)
        ),
        answers=2,
    )
    assert status(answers[0]) == 413
    assert "larger than the limit of 2048 bytes" in error(answers[0])
    assert status(answers[1]) == 200 and body_of(answers[1]) == ANSWER


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"zz\r\n" + BODY + b"\r\n0\r\n\r\n", id="not-hex"),
        pytest.param(b"ffffffffffffffffff\r\n" + BODY, id="overflowing"),
        pytest.param(b"5\r\n" + BODY + b"\r\n0\r\n\r\n", id="longer-than-said"),
    ],
)
def test_an_invalid_chunk_is_refused_400_and_closes(server: LiveServer, body: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(request(DIRECT, body, b"transfer-encoding: chunked", length=False))
        answer = read_to_close(sock)
    assert status(answer) == 400, answer
    assert error(answer).startswith("malformed HTTP request: "), error(answer)
    assert header(answer, b"connection") == b"close"
    serves_normally(server)


def test_trailer_fields_do_not_become_request_headers(server: LiveServer) -> None:
    """A chunked body's trailer fields are not headers (RFC 9110 6.5.1): one saying
    ``content-type: application/msgpack``, or pinning a version, changes nothing. They
    used to be appended to the request's headers (and won: a dict of them, the last
    value kept), so a field a proxy never saw in the head reached the route."""
    trailer = b"content-type: application/msgpack\r\nx-fnrt-version: nope\r\n"
    answers = both_paths(
        server,
        lambda path: request(
            path, chunked(BODY, 5, trailer=trailer), b"transfer-encoding: chunked", length=False
        ),
    )
    assert status(answers[0]) == 200, answers[0]
    assert body_of(answers[0]) == ANSWER


def test_a_content_length_shorter_than_the_body_answers_it_then_refuses_the_rest(
    server: LiveServer,
) -> None:
    """The bytes past the length are the next request: not one, so 400 after the answer."""
    with connect(server) as sock:
        sock.sendall(request(DIRECT, BODY + b"XYZ\r\n\r\n", b"content-length: 21", length=False))
        sent = read_to_close(sock)
    first, second = read_answers_from(sent, 2)
    assert status(first) == 200 and body_of(first) == ANSWER, sent
    assert status(second) == 400 and header(second, b"connection") == b"close", sent
    assert error(second).startswith("malformed HTTP request: ")
    serves_normally(server)


def read_answers_from(data: bytes, answers: int) -> list[bytes]:
    """``answers`` whole responses from ``data`` (all that was read before a close)."""
    out = []
    for _ in range(answers):
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int(header(head + b"\r\n\r\n", b"content-length"))
        out.append(head + b"\r\n\r\n" + rest[:length])
        data = rest[length:]
    assert data == b"", data
    return out


def test_a_content_length_longer_than_the_body_then_a_close_is_499(server: LiveServer) -> None:
    with connect(server) as sock:
        sock.sendall(request(DIRECT, BODY, b"content-length: 40", length=False))
        sock.shutdown(socket.SHUT_WR)  # the 19 bytes never come
        assert read_to_close(sock) == b""
    serves_normally(server)
    with server.client() as c:
        wait_until(lambda: 'status="499"' in c.get("/metrics").text)


def test_both_a_length_and_chunked_is_refused_400(server: LiveServer) -> None:
    """Request smuggling's usual shape: refused, never read one way or the other."""
    body = chunked(BODY)
    with connect(server) as sock:
        sock.sendall(request(DIRECT, body, b"transfer-encoding: chunked"))
        answer = read_to_close(sock)
    assert status(answer) == 400 and header(answer, b"connection") == b"close", answer
    assert "Transfer-Encoding" in error(answer), error(answer)
    serves_normally(server)


@pytest.mark.parametrize("value", [b"abc", b"-5", b"1e3", b"21, 21"])
def test_a_malformed_content_length_is_refused_400(server: LiveServer, value: bytes) -> None:
    with connect(server) as sock:
        sock.sendall(request(DIRECT, BODY, b"content-length: " + value, length=False))
        answer = read_to_close(sock)
    assert status(answer) == 400, answer
    assert "Content-Length" in error(answer), error(answer)
    serves_normally(server)


# --- fields a proxy could read another way ----------------------------------------------


@pytest.mark.parametrize(
    "coding",
    [
        (b"transfer-encoding: gzip, chunked",),
        (b"transfer-encoding: gzip", b"transfer-encoding: chunked"),
    ],
)
def test_a_transfer_coding_other_than_chunked_is_refused_501(
    server: LiveServer, coding: tuple[bytes, ...]
) -> None:
    """uvicorn read the chunks and handed on what they held as the body, still
    compressed (RFC 9112 6.1: 501 for a coding the server does not understand)."""
    for path in (DIRECT, THROUGH_APP):
        with connect(server) as sock:
            sock.sendall(request(path, chunked(BODY), *coding, length=False))
            answer = read_to_close(sock)
        assert status(answer) == 501 and header(answer, b"connection") == b"close", answer
        assert error(answer).startswith("transfer coding 'gzip' is not supported"), answer
    serves_normally(server)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (b"host: other", "host"),
        (b"host: t", "host"),
        (b"content-type: application/msgpack", "content-type"),
    ],
)
def test_a_field_that_may_come_once_given_twice_is_refused_400(
    server: LiveServer, extra: bytes, field: str
) -> None:
    """Two Content-Types were read the last by the connection and the first by the app;
    two Hosts are a 400 by RFC 9112 3.2, even alike."""
    answers = both_paths(server, lambda path: request(path, BODY, extra))
    assert status(answers[0]) == 400 and header(answers[0], b"connection") == b"close"
    assert error(answers[0]) == f"'{field}' is given 2 times"
    serves_normally(server)


def test_the_same_content_type_twice_is_served(server: LiveServer) -> None:
    answers = both_paths(
        server, lambda path: request(path, BODY, b"content-type: application/json")
    )
    assert status(answers[0]) == 200 and body_of(answers[0]) == ANSWER


REFUSED = b"transfer-encoding: gzip, chunked"


@pytest.mark.parametrize("path", [DIRECT, THROUGH_APP])
def test_a_refused_head_in_a_pipeline_is_answered_after_the_requests_before_it(
    server: LiveServer, path: bytes
) -> None:
    """Behind a request still computing, the refusal waits for its answer; nothing after
    it is read, and the connection closes."""
    import fnrt_test_gates  # type: ignore[import-not-found]

    fnrt_test_gates.calls = []
    gated = path.replace(b"echo", b"gated").replace(b"ech%6f", b"gate%64")
    bad = request(path, chunked(BODY), REFUSED, length=False)
    gate("abuse").clear()
    with connect(server) as sock:
        sock.sendall(request(gated) + bad + request(path))
        wait_until(lambda: fnrt_test_gates.calls == [1])  # the first computes
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):  # and nothing is answered yet
            sock.recv(1)
        sock.settimeout(10)
        gate("abuse").set()
        first, refused = read_answers_from(read_to_close(sock), 2)
    assert status(first) == 200 and body_of(first) == b'{"y":[[1,2,3,4]]}', first
    assert status(refused) == 501 and header(refused, b"connection") == b"close"
    assert error(refused).startswith("transfer coding 'gzip' is not supported")
    serves_normally(server)


def test_a_refused_request_still_sending_a_large_body_gets_its_answer(server: LiveServer) -> None:
    """Its body is read and dropped before the answer: closed while the client still
    sent, the connection was reset, and most clients of a 4 MiB body never saw the 501."""
    for _ in range(3):
        with connect(server) as sock:
            data = request(DIRECT, chunked(bytes(4 << 20), 1 << 20), REFUSED, length=False)
            sender = threading.Thread(target=sock.sendall, args=(data,))
            sender.start()
            answer = read_to_close(sock)
            sender.join(10)
        assert status(answer) == 501, answer
    serves_normally(server)


def test_a_refused_request_that_waits_for_100_continue_is_answered_without_it(
    server: LiveServer,
) -> None:
    head = request(DIRECT, b"", b"expect: 100-continue", REFUSED, length=False)
    with connect(server) as sock:
        sock.sendall(head)  # and never the body: it waits to be told to send it
        answer = read_to_close(sock)
    assert status(answer) == 501 and not answer.startswith(b"HTTP/1.1 100"), answer
    serves_normally(server)


# --- HTTP/1.0 ------------------------------------------------------------------------


@pytest.mark.parametrize("keep_alive", [False, True])
def test_http_1_0_is_answered_and_closed(server: LiveServer, keep_alive: bool) -> None:
    """uvicorn keeps no HTTP/1.0 connection alive, even one that asks: the answer says
    close, and closes."""
    extra = (b"connection: keep-alive",) if keep_alive else ()
    answers = []
    for path in (DIRECT, THROUGH_APP):
        with connect(server) as sock:
            sock.sendall(request(path, BODY, *extra, version=b"1.0"))
            answers.append(without_date(read_to_close(sock)))
    assert answers[0] == answers[1]
    assert status(answers[0]) == 200 and body_of(answers[0]) == ANSWER
    assert header(answers[0], b"connection") == b"close"


# --- pipelines with an error in the middle ----------------------------------------------


def test_a_pipeline_with_errors_in_the_middle_is_answered_in_order(server: LiveServer) -> None:
    """404, 413, 400 and 422 between good requests, sent at once: each answered, in
    order, the same as the app answers them; the connection serves on."""
    too_big = b'{"x": [[1, 2, 3, 4]], "pad": "' + b"a" * LIMIT + b'"}'

    def pipeline(path: bytes) -> bytes:
        return b"".join(
            (
                request(path),
                request(b"/v1/functions/nope/invoke"),
                request(path, too_big),
                request(path, b"{"),
                request(path, b'{"x": [[1, 2, 3]]}'),
                request(path, msgpack.packb({"x": 1}), media_type=b"application/msgpack"),
                request(path, b'{"x": [[5, 6, 7, 8]]}'),
            )
        )

    answers = both_paths(server, pipeline, answers=7)
    assert [status(a) for a in answers] == [200, 404, 413, 400, 422, 422, 200], answers
    assert "nope" in error(answers[1])
    assert "larger than the limit" in error(answers[2])
    assert "JSON" in error(answers[3])
    assert "x" in error(answers[4])
    assert header(answers[5], b"content-type") == b"application/msgpack"
    assert "x" in error(answers[5])
    assert body_of(answers[6]) == b'{"y":[[10.0,12.0,14.0,16.0]]}'


def test_oip_infer_and_generate_in_a_pipeline_answer_as_the_app(server: LiveServer) -> None:
    """The other data routes the connection answers: an OIP infer that is malformed, one
    whose binary header length lies, a good one, and a generate of a function that does
    not generate, pipelined; the same answers, in order, as the app's."""
    x = b'{"name": "x", "shape": [1, 4], "datatype": "FP32"'
    good = b'{"inputs": [' + x + b', "data": [1, 2, 3, 4]}]}'
    binary = b'{"inputs": [' + x + b', "parameters": {"binary_data_size": 16}}]}'

    def pipeline(path: bytes) -> bytes:
        infer = path.replace(b"/v1/functions/", b"/v2/models/").replace(b"/invoke", b"/infer")
        generate = path.replace(b"/invoke", b"/generate")
        return b"".join(
            (
                request(infer, b'{"inputs": 5}'),
                request(infer, binary, b"inference-header-content-length: 99999"),
                request(infer, good),
                request(generate),
                request(path),
            )
        )

    answers = both_paths(server, pipeline, answers=5)
    assert [status(a) for a in answers] == [400, 400, 200, 400, 200], answers
    assert "inputs" in error(answers[0])
    assert "Inference-Header-Content-Length" in error(answers[1])
    assert json.loads(body_of(answers[2]))["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]
    assert "not generative" in error(answers[3])
    assert body_of(answers[4]) == ANSWER


@pytest.mark.parametrize("path", [DIRECT, THROUGH_APP])
@pytest.mark.parametrize("malformed", ["head", "chunk"])
def test_a_malformed_request_in_a_pipeline_is_refused_after_the_answers_before_it(
    server: LiveServer, path: bytes, malformed: str
) -> None:
    """The parser refuses the third request as soon as it reads it (its head, or a
    chunk of its body), while the first two are still in progress: their answers come
    first, in order, then the 400, then the close. The 400 used to be written at once,
    ahead of them: the client read it as the first request's answer, and the two
    answers were lost."""
    if malformed == "head":
        bad = b"BAD / HTTP/1.1\r\n\r\n"
    else:
        bad = request(path, b"zz\r\n" + BODY, b"transfer-encoding: chunked", length=False)
    pipeline = request(path) + request(path, b'{"x": [[5, 6, 7, 8]]}') + bad
    with connect(server) as sock:
        sock.sendall(pipeline)
        sent = read_to_close(sock)
    first, second, refused = read_answers_from(sent, 3)
    assert status(first) == 200 and body_of(first) == ANSWER, sent
    assert status(second) == 200 and body_of(second) == b'{"y":[[10.0,12.0,14.0,16.0]]}'
    assert status(refused) == 400 and header(refused, b"connection") == b"close"
    assert error(refused).startswith("malformed HTTP request: ")
    serves_normally(server)


# --- clients that leave -------------------------------------------------------------------


def test_a_client_gone_while_its_request_computes_is_logged_499(server: LiveServer) -> None:
    """The answer has nobody to reach: metrics say 499, not 200 (as they say for a
    client gone while its request waited in the queue)."""
    import fnrt_test_gates  # type: ignore[import-not-found]

    fnrt_test_gates.calls = []
    with connect(server) as sock:
        sock.sendall(request(b"/v1/functions/gated/invoke", b'{"x": [[1.0]]}'))
        wait_until(lambda: fnrt_test_gates.calls == [1])  # in the handler now
        open_before = server.open_connections()
    wait_until(lambda: server.open_connections() == open_before - 1)  # the server saw it
    gate("abuse").set()
    with server.client() as c:
        wait_until(lambda: 'function="gated",status=' in c.get("/metrics").text)
        metrics = c.get("/metrics").text
    lines = [line for line in metrics.splitlines() if line.startswith("fnrt_requests_total{")]
    gated = [line for line in lines if 'function="gated"' in line]
    assert gated and all('status="499"' in line for line in gated), gated
    serves_normally(server)


def test_a_client_that_closes_right_after_sending_leaves_the_server_serving(
    server: LiveServer,
) -> None:
    """Each of these requests is answered (200) or, its client seen gone first, logged
    499; none is a server error, and nothing is left open."""
    with server.client() as c:
        before = c.get("/metrics").text.count('status="5')
    for _ in range(20):
        with connect(server) as sock:
            sock.sendall(request() + request())  # and gone at once
    serves_normally(server)
    wait_until(lambda: server.open_connections() == 0)
    with server.client() as c:
        metrics = c.get("/metrics").text
    assert metrics.count('status="5') == before, metrics
    statuses = {
        line.split('status="')[1][:3]
        for line in metrics.splitlines()
        if line.startswith('fnrt_requests_total{function="echo"')
    }
    assert statuses <= {"200", "499"}, statuses


BIG = """
import numpy as np
import fnrt_test_gates

def handle(batch):
    fnrt_test_gates.calls.append(len(batch))
    return [{"y": np.zeros(1 << 19, np.float32)} for r in batch]
"""


@pytest.mark.parametrize("path", [b"/v1/functions/big/invoke", b"/v1/functions/bi%67/invoke"])
def test_pipelined_answers_a_client_does_not_take_wait_for_it(
    tmp_path: Path, server: LiveServer, path: bytes
) -> None:
    """20 pipelined requests of 80 bytes, each answered 2 MiB, from a client that reads
    nothing: the next answer waits until the one before is taken, as uvicorn's send
    waits. The connection's own answer did not wait: all 20 were computed and 37 MiB
    held in its write buffer (bounded only by the minimum rate's window, 10 s)."""
    import fnrt_test_gates  # type: ignore[import-not-found]

    folder = write_function(tmp_path / "src", "big", BIG, manifest=BATCH_OF_ONE_MANIFEST)
    server.call(server.node.deployer.deploy(publish(server.node.repository, folder)))
    fnrt_test_gates.calls = []
    one = msgpack.packb({"x": 1})
    sent = request(path, one, media_type=b"application/msgpack")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # takes little at a time
    sock.connect(("127.0.0.1", server.port))
    with sock:
        sock.sendall(sent * 20)  # and reads nothing yet
        wait_until(lambda: len(fnrt_test_gates.calls) >= 2)
        with pytest.raises(AssertionError):  # nor more computed, nor more held
            wait_until(lambda: len(fnrt_test_gates.calls) > 3, timeout_s=2)
        held = max(p.transport.get_write_buffer_size() for p in protocols(server))
        assert held < 3 * 2**21, held
        answers = read_answers(sock, 20)  # then all of them, in order
    assert [status(a) for a in answers] == [200] * 20
    assert len(fnrt_test_gates.calls) == 20


# --- paths and headers --------------------------------------------------------------------


def test_a_long_function_name_is_a_404_naming_it(server: LiveServer) -> None:
    name = b"f" * 30_000
    escaped = name[:-1] + b"%66"
    answers = both_paths(
        server, lambda path: request(path.replace(b"echo", name).replace(b"ech%6f", escaped))
    )
    assert status(answers[0]) == 404 and name.decode() in error(answers[0])
    serves_normally(server)


def test_a_long_query_string_is_ignored(server: LiveServer) -> None:
    answers = both_paths(server, lambda path: request(path + b"?q=" + b"a" * 30_000))
    assert status(answers[0]) == 200 and body_of(answers[0]) == ANSWER


def test_a_path_past_what_the_url_parser_takes_is_refused(server: LiveServer) -> None:
    with connect(server) as sock:
        sock.sendall(request(DIRECT + b"?q=" + b"a" * 70_000))
        answer = read_to_close(sock)
    # the URL parser refuses past 65,535 bytes (400), the head's limit past 64 KiB (431):
    # which comes first depends on how the server's reads cut the request
    assert status(answer) in (400, 431) and header(answer, b"connection") == b"close", answer
    assert "url is too long" in error(answer) or "larger than the limit" in error(answer)
    serves_normally(server)


@pytest.mark.parametrize(
    "escaped", [b"/v1/functions/e%63ho/invoke", b"/v1/functions/echo%2Finvoke"]
)
def test_a_path_with_escapes_is_left_to_the_app(server: LiveServer, escaped: bytes) -> None:
    with connect(server) as sock:
        answer = exchange(sock, request(escaped))[0]
        cycles = {type(p.cycle).__name__ for p in protocols(server) if p.cycle is not None}
    assert "Answering" not in cycles
    assert status(answer) == 200 and body_of(answer) == ANSWER  # the app unescapes, as uvicorn


def protocols(server: LiveServer) -> list[object]:
    return list(server._server.server_state.connections)


def test_latin_1_header_values_are_read_as_latin_1(server: LiveServer) -> None:
    answers = both_paths(server, lambda path: request(path, BODY, b"x-fnrt-version: caf\xe9"))
    assert status(answers[0]) == 404 and "café" in error(answers[0])
    answers = both_paths(server, lambda path: request(path, BODY, b"x-fnrt-priority: \xff"))
    assert status(answers[0]) == 400 and "x-fnrt-priority" in error(answers[0])
    serves_normally(server)


def test_a_few_hundred_headers_are_served(server: LiveServer) -> None:
    many = [b"x-h%d: %d" % (i, i) for i in range(500)]
    answers = both_paths(server, lambda path: request(path, BODY, *many))
    assert status(answers[0]) == 200 and body_of(answers[0]) == ANSWER


@pytest.mark.parametrize("shape", ["one-value", "many-fields"])
def test_a_head_past_its_limit_is_refused_431(server: LiveServer, shape: str) -> None:
    """A head that never ends was held until the head deadline (10 s by default): 13 MB
    of small fields held 100 MiB, and a long value was joined again at each read
    (quadratic). Past 64 KiB it is refused 431, and the connection closes."""
    from fnrt.runtime.http.connection import MAX_HEAD_BYTES

    piece = (
        b"x-a: " + b"a" * 8000
        if shape == "one-value"
        else b"".join(b"x-%d: v\r\n" % i for i in range(800))
    )
    with connect(server) as sock:
        sock.sendall(b"POST /v1/functions/echo/invoke HTTP/1.1\r\nhost: t\r\n")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused midway
            for _ in range(MAX_HEAD_BYTES // len(piece) + 2):  # past it, the head not ended
                sock.sendall(piece)
                time.sleep(0.001)
        answer = read_to_close(sock)
    assert status(answer) == 431, answer[:300]
    assert header(answer, b"connection") == b"close"
    assert "larger than the limit of 65536 bytes" in error(answer)
    serves_normally(server)


def test_a_head_past_its_limit_behind_a_request_in_progress_is_refused_after_its_answer(
    server: LiveServer,
) -> None:
    import fnrt_test_gates  # type: ignore[import-not-found]

    fnrt_test_gates.calls = []
    with connect(server) as sock:
        sock.sendall(request(b"/v1/functions/gated/invoke", b'{"x": [[1.0]]}'))
        wait_until(lambda: fnrt_test_gates.calls == [1])  # in the handler
        sock.sendall(b"POST /v1/functions/echo/invoke HTTP/1.1\r\nx-a: ")
        for _ in range(10):  # 80 KB of a head, not ended
            sock.sendall(b"a" * 8000)
            time.sleep(0.01)
        gate("abuse").set()
        answer, refused = read_answers_from(read_to_close(sock), 2)
    assert status(answer) == 200 and body_of(answer) == b'{"y":[[1.0]]}', answer
    assert status(refused) == 431


# --- bodies over the limit and 100-continue -------------------------------------------------


@pytest.mark.parametrize("media_type", [b"application/json", b"application/msgpack"])
def test_a_body_over_the_limit_is_413_in_the_requests_format(
    server: LiveServer, media_type: bytes
) -> None:
    """A body past the limit (its first 64 KiB here before the answer), refused in the
    request's format; the rest of it is read and dropped, and the connection serves on."""
    big = b"a" * (256 * 1024)
    answers = both_paths(
        server, lambda path: request(path, big, media_type=media_type) + request(path), answers=2
    )
    assert status(answers[0]) == 413
    assert header(answers[0], b"content-type") == media_type
    assert "larger than the limit" in error(answers[0])
    assert status(answers[1]) == 200 and body_of(answers[1]) == ANSWER


@pytest.mark.parametrize("path", [DIRECT, THROUGH_APP])
def test_an_expected_body_over_the_limit_is_refused_without_100_and_closes(
    server: LiveServer, path: bytes
) -> None:
    """``Expect: 100-continue`` with a length over the limit: 413 at once, no ``100
    Continue``, and the connection closes: the client need never send that body, and
    kept open the connection read its next request as the body (a 408 long after)."""
    head = request(path, b"", b"expect: 100-continue", b"content-length: 100000", length=False)
    with connect(server) as sock:
        sock.sendall(head)
        answer = read_answers(sock, 1)[0]
        assert not answer.startswith(b"HTTP/1.1 100")
        assert status(answer) == 413 and "larger than the limit" in error(answer)
        assert header(answer, b"connection") == b"close"
        with pytest.raises(OSError):  # and the connection closes (a next request: refused)
            for _ in range(50):
                sock.sendall(request())
                time.sleep(0.01)
                if not sock.recv(65536):
                    raise ConnectionResetError
    serves_normally(server)


# --- draining --------------------------------------------------------------------------------


def test_requests_while_draining_are_answered_with_connection_close(server: LiveServer) -> None:
    with connect(server) as kept:
        assert status(exchange(kept, request())[0]) == 200  # kept alive, before the drain
        server.node.lifecycle.drain()
        for path in (DIRECT, THROUGH_APP):
            with connect(server) as sock:
                sock.sendall(request(path))
                answer = read_to_close(sock)
            assert status(answer) == 200 and body_of(answer) == ANSWER
            assert header(answer, b"connection") == b"close"
        kept.sendall(request())
        answer = read_to_close(kept)
    assert status(answer) == 200 and header(answer, b"connection") == b"close"


def test_a_request_in_progress_when_the_server_stops_is_answered_with_close(
    server: LiveServer,
) -> None:
    """uvicorn's shutdown asks each connection to close after its answer: the data route
    the connection answers says ``connection: close`` and closes, as the app's would."""
    import threading

    import fnrt_test_gates  # type: ignore[import-not-found]

    fnrt_test_gates.calls = []
    with connect(server) as sock:
        sock.sendall(request(b"/v1/functions/gated/invoke", b'{"x": [[1.0]]}'))
        wait_until(lambda: fnrt_test_gates.calls == [1])  # in the handler
        (protocol,) = [p for p in protocols(server) if getattr(p, "cycle", None) is not None]
        stopping = threading.Thread(target=server.stop)
        stopping.start()
        wait_until(lambda: not protocol.cycle.keep_alive)  # told to close after its answer
        gate("abuse").set()
        answer = read_to_close(sock)
        stopping.join(30)
    assert status(answer) == 200 and body_of(answer) == b'{"y":[[1.0]]}', answer
    assert header(answer, b"connection") == b"close"


def test_long_data_paths_are_not_kept_by_the_connections_route_table(tmp_path: Path) -> None:
    """The connection keeps the route of the last 1,024 data paths it matched; a path
    longer than any function or version name can be is answered (404) but not kept:
    1,024 names of 60 KB each held 120 MiB (the path, and the name in its parameters)."""
    import tracemalloc

    node = make_node(tmp_path)
    find = data_apps(build_app(node.settings, node))
    assert find is not None
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1024):
            route = find(f"/v1/functions/{i:05d}{'f' * 60_000}/invoke")
            assert route is not None  # still a data route: it answers 404 for the name
            del route
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 8 * 2**20, held
    assert find("/v1/functions/echo/invoke") is find("/v1/functions/echo/invoke")  # kept
