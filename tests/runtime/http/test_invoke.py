"""The invoke route over a real socket: formats, errors, and a server that keeps serving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import msgpack
import msgpack_numpy
import numpy as np
import pytest

from fnrt.runtime import scheduler as sched
from support import LiveServer, error_of, gate, live_server, publish, wait_until, write_function

X = [[1.0, 2.0, 3.0, 4.0]]


@pytest.fixture
def server(tmp_path: Path):
    with live_server(tmp_path, max_body_bytes=4096) as srv:
        srv.call(
            srv.node.deployer.deploy(
                publish(srv.node.repository, write_function(tmp_path / "src", "echo"))
            )
        )
        yield srv


def _invoke_msgpack(server: LiveServer, inputs: dict[str, Any]) -> httpx.Response:
    """An invoke of echo with ``inputs`` in a msgpack body (arrays as msgpack_numpy's)."""
    body = msgpack.packb(inputs, default=msgpack_numpy.encode)
    headers = {"content-type": "application/msgpack"}
    with server.client() as c:
        return c.post("/v1/functions/echo/invoke", content=body, headers=headers)


def test_json_in_json_out(server: LiveServer) -> None:
    with server.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"x": X})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"y": [[2.0, 4.0, 6.0, 8.0]]}
    assert r.headers["x-fnrt-version"].startswith("v-")
    assert r.headers["x-fnrt-function"] == "echo"


def test_msgpack_numpy_client_round_trip(server: LiveServer) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    r = _invoke_msgpack(server, {"x": x})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/msgpack"
    out = msgpack.unpackb(r.content, object_hook=msgpack_numpy.decode)
    np.testing.assert_array_equal(out["y"], x * 2)
    assert out["y"].dtype == np.float32


def test_accept_overrides_request_format(server: LiveServer) -> None:
    with server.client() as c:
        r = c.post(
            "/v1/functions/echo/invoke", json={"x": X}, headers={"accept": "application/msgpack"}
        )
    out = msgpack.unpackb(r.content, object_hook=msgpack_numpy.decode)
    np.testing.assert_array_equal(out["y"], np.array(X, dtype=np.float32) * 2)


@pytest.mark.parametrize(
    ("body", "headers", "status", "words"),
    [
        (b'{"x": [[1, 2', {"content-type": "application/json"}, 400, "not valid JSON"),
        (b"\xc1\xc1\xc1", {"content-type": "application/msgpack"}, 400, "not valid msgpack"),
        (b"[1, 2]", {"content-type": "application/json"}, 400, "must be a map"),
        (b'{"z": [[1,2,3,4]]}', {"content-type": "application/json"}, 422, "missing input 'x'"),
        (
            b'{"x": [[1,2,3,4]], "w": 1}',
            {"content-type": "application/json"},
            422,
            "unexpected input 'w'",
        ),
        (
            b'{"x": [[1,2,3]]}',
            {"content-type": "application/json"},
            422,
            "input 'x': expected shape [-1, 4]",
        ),
        (
            b'{"x": [[1,2],[3]]}',
            {"content-type": "application/json"},
            422,
            "input 'x': not a rectangular",
        ),
        (b'{"x": [["a","b","c","d"]]}', {"content-type": "application/json"}, 422, "input 'x'"),
        (b'{"x": [[1,2,3,4]]}', {"content-type": "text/plain"}, 415, "unsupported Content-Type"),
        (
            b'{"x": [[1,2,3,4]]}',
            {"content-type": "application/json", "accept": "image/png"},
            415,
            "cannot answer",
        ),
    ],
)
def test_bad_requests(
    server: LiveServer, body: bytes, headers: dict[str, str], status: int, words: str
) -> None:
    with server.client() as c:
        r = c.post("/v1/functions/echo/invoke", content=body, headers=headers)
        assert r.status_code == status, r.text
        assert words in error_of(r)["error"]
        assert c.post("/v1/functions/echo/invoke", json={"x": X}).status_code == 200


def test_wrong_dtype_over_msgpack_names_the_input(server: LiveServer) -> None:
    r = _invoke_msgpack(server, {"x": np.ones((1, 4), dtype=np.float64)})
    assert r.status_code == 422
    # the error comes back in the request's own format
    error = msgpack.unpackb(r.content)
    assert error == {"error": "input 'x': expected dtype float32, got float64", "input": "x"}


def test_object_arrays_are_refused_not_unpickled(server: LiveServer) -> None:
    r = _invoke_msgpack(server, {"x": np.array([object()], dtype=object)})
    assert r.status_code == 400
    assert "object" in msgpack.unpackb(r.content)["error"]


def test_unknown_function_is_404(server: LiveServer) -> None:
    with server.client() as c:
        for name in ("nope", "Bad Name!"):
            r = c.post(f"/v1/functions/{name}/invoke", json={"x": X})
            assert r.status_code == 404
            assert "is not deployed" in r.json()["error"]


def test_body_over_the_limit_is_413(server: LiveServer) -> None:
    big = {"x": [[0.5, 0.5, 0.5, 0.5]] * 2000}
    with server.client() as c:
        r = c.post("/v1/functions/echo/invoke", json=big)
        assert r.status_code == 413
        assert r.json()["limit_bytes"] == 4096
        # chunked bodies (no Content-Length) are cut off too
        chunks = iter([b'{"x": [' + b"[1,2,3,4]," * 600, b"[1,2,3,4]]}"])
        r = c.post(
            "/v1/functions/echo/invoke",
            content=chunks,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413
        assert c.post("/v1/functions/echo/invoke", json={"x": X}).status_code == 200


FAILING = """
class Flaky:
    def __call__(self, batch):
        if any(float(r["x"].sum()) < 0 for r in batch):
            raise RuntimeError("negative input")
        return [{"y": r["x"]} for r in batch]
"""

WRONG_COUNT = """
def handle(batch):
    return [{"y": batch[0]["x"]}] * (len(batch) + 1)
"""


def test_handler_exception_is_500_with_error_id_and_server_keeps_serving(
    tmp_path: Path, server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    folder = write_function(
        tmp_path / "src", "flaky", FAILING, manifest=_manifest("flaky", "handler:Flaky")
    )
    server.deploy(folder)
    with server.client() as c:
        r = c.post("/v1/functions/flaky/invoke", json={"x": [[-1, -1, -1, -1]]})
        assert r.status_code == 500
        body = r.json()
        assert "negative input" in body["error"]
        assert len(body["error_id"]) == 16
        assert any(body["error_id"] in rec.getMessage() and rec.exc_info for rec in caplog.records)
        assert c.post("/v1/functions/flaky/invoke", json={"x": X}).status_code == 200
        assert c.post("/v1/functions/echo/invoke", json={"x": X}).status_code == 200
        assert c.get("/healthz").status_code == 200


def test_wrong_result_count_fails_the_batch_not_the_server(
    tmp_path: Path, server: LiveServer
) -> None:
    folder = write_function(
        tmp_path / "src", "miscount", WRONG_COUNT, manifest=_manifest("miscount", "handler:handle")
    )
    server.deploy(folder)
    with server.client() as c:
        r = c.post("/v1/functions/miscount/invoke", json={"x": X})
        assert r.status_code == 500
        assert "returned 2 results for a batch of 1" in r.json()["error"]
        assert c.post("/v1/functions/echo/invoke", json={"x": X}).status_code == 200


SLOW = """
import fnrt_test_gates

def handle(batch):
    fnrt_test_gates.gate("release").wait(30)
    return [{"y": r["x"]} for r in batch]
"""


def test_slow_handler_stalls_neither_health_nor_other_functions(
    tmp_path: Path, server: LiveServer
) -> None:
    folder = write_function(
        tmp_path / "src",
        "slow",
        SLOW,
        manifest=_manifest("slow", "handler:handle", max_queue=2, max_batch_size=1),
    )
    server.deploy(folder)
    release = gate("release")
    with server.client() as c, ThreadPoolExecutor(4) as pool:
        first = pool.submit(c.post, "/v1/functions/slow/invoke", json={"x": X})
        scheduler = server.call(server.registry.get("slow"))
        wait_until(lambda: sched.activity(scheduler).busy and scheduler.batcher.queued == 0)
        # the handler is blocked: health checks and other functions still answer
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        assert c.post("/v1/functions/echo/invoke", json={"x": X}).status_code == 200
        # fill the queue (2), then the next request is refused with 429 + Retry-After
        queued = [pool.submit(c.post, "/v1/functions/slow/invoke", json={"x": X}) for _ in range(2)]
        wait_until(lambda: scheduler.batcher.queued == 2)
        r = c.post("/v1/functions/slow/invoke", json={"x": X})
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert "queued" in r.json()["error"]
        release.set()
        assert first.result().status_code == 200
        assert [f.result().status_code for f in queued] == [200, 200]


def _manifest(name: str, handler: str, max_queue: int = 64, max_batch_size: int = 8) -> str:
    return f"""
name = "{name}"
handler = "{handler}"

[inputs]
x = {{{{ dtype = "float32", shape = [-1, 4] }}}}

[batching]
max_batch_size = {max_batch_size}

[scaling]
max_queue = {max_queue}
"""


TEXT_HANDLER = """
import numpy as np

class Text:
    def __call__(self, batch):
        return [
            {"upper": np.array([s.upper() for s in r["s"]], dtype=object), "half": r["b"] / 2}
            for r in batch
        ]
"""

TEXT_MANIFEST = """
name = "{name}"
handler = "handler:Text"

[inputs]
s = {{ dtype = "bytes", shape = [-1] }}
b = {{ dtype = "bfloat16", shape = [-1, 2] }}

[outputs]
upper = {{ dtype = "bytes", shape = [-1] }}
half = {{ dtype = "bfloat16", shape = [-1, 2] }}
"""


def test_bytes_and_bfloat16_tensors_over_json_and_msgpack(tmp_path: Path) -> None:
    import ml_dtypes

    from fnrt.functions.codec import decode_msgpack, encode_msgpack

    folder = write_function(tmp_path / "src", "text", TEXT_HANDLER, TEXT_MANIFEST)
    with live_server(tmp_path) as srv:
        srv.deploy(folder)
        with srv.client() as c:
            r = c.post(
                "/v1/functions/text/invoke", json={"s": ["ab", "\u00e9t\u00e9"], "b": [[1, 3]]}
            )
            assert r.status_code == 200, r.text
            assert r.json() == {"upper": ["AB", "\u00e9T\u00e9"], "half": [[0.5, 1.5]]}
            b = np.array([[2, 5]], dtype=ml_dtypes.bfloat16)
            body = encode_msgpack({"s": [b"\xffx"], "b": b})
            r = c.post(
                "/v1/functions/text/invoke",
                content=body,
                headers={"content-type": "application/msgpack"},
            )
            assert r.status_code == 200, r.text
            out = decode_msgpack(r.content)
            assert out["upper"] == [b"\xffX"]  # bytes stay bytes in msgpack
            assert out["half"].dtype == ml_dtypes.bfloat16
            np.testing.assert_array_equal(out["half"], b / 2)
            r = c.post(
                "/v1/functions/text/invoke",
                content=body,
                headers={"content-type": "application/msgpack", "accept": "application/json"},
            )
            assert r.status_code == 400  # not UTF-8: JSON cannot carry it
            assert "not UTF-8" in error_of(r)["error"]
            r = c.post("/v1/functions/text/invoke", json={"s": [1, 2], "b": [[1, 3]]})
            assert r.status_code == 422
            assert error_of(r) == {
                "error": "input 's': expected strings or bytes, got int",
                "input": "s",
            }


def test_json_never_loses_a_number_without_a_word(server: LiveServer) -> None:
    from fnrt.functions.codec import encode_msgpack

    with server.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"x": [[1e39, 1, 2, 3]]})
        assert r.status_code == 422, r.text  # was 200 with null
        assert "out of range for float32" in error_of(r)["error"]
        nan = np.array([[np.nan, 1, 2, 3]], np.float32)
        body = encode_msgpack({"x": nan})
        msgpack_headers = {"content-type": "application/msgpack"}
        r = c.post("/v1/functions/echo/invoke", content=body, headers=msgpack_headers)
        assert r.status_code == 200  # msgpack carries NaN as it is
        json_answer = {**msgpack_headers, "accept": "application/json"}
        r = c.post("/v1/functions/echo/invoke", content=body, headers=json_answer)
        assert r.status_code == 500  # the output's fault (weights gone bad), not the request's
        assert error_of(r)["error"].startswith("output 'y' holds NaN or infinite values")
        oip = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1e39] * 4}]}
        r = c.post("/v2/models/echo/infer", json=oip)
        assert r.status_code == 422 and "out of range" in error_of(r)["error"]
        assert c.get("/healthz").status_code == 200
