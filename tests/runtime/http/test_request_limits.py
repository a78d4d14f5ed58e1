"""Small requests that would cost the most: each is refused early, the node keeps serving."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from support import LiveServer, error_of, live_server, write_function

#: An echo with no declared inputs or outputs: any names and shapes come back as sent.
UNDECLARED = """
name = "{name}"
handler = "handler:Echo"
"""

ECHO_ANY = """
class Echo:
    def __call__(self, batch):
        return [dict(r) for r in batch]
"""


@pytest.fixture
def server(tmp_path: Path):
    with live_server(tmp_path, max_json_body_bytes=64 * 1024) as srv:
        for name, kwargs in (
            ("any", {"handler": ECHO_ANY, "manifest": UNDECLARED}),
            ("echo", {}),
        ):
            folder = write_function(tmp_path / "src", name, **kwargs)
            srv.deploy(folder)
        yield srv


def empty(shape: list[int]) -> bytes:
    array = {"nd": True, "type": "<f4", "kind": "", "shape": shape, "data": b""}
    return msgpack.packb({"x": array})


def healthy(server: LiveServer) -> None:
    with server.client() as c:
        assert c.get("/healthz", timeout=2).status_code == 200
        r = c.post("/v1/functions/echo/invoke", json={"x": [[1, 2, 3, 4]]}, timeout=5)
        assert r.status_code == 200


@pytest.mark.parametrize(
    ("shape", "what"), [([134217728, 0], "elements"), ([67108864, 0], "response")]
)
def test_a_declared_empty_shape_costs_nothing(
    server: LiveServer, shape: list[int], what: str
) -> None:
    headers = {"content-type": "application/msgpack", "accept": "application/json"}
    with server.client() as c:
        r = c.post("/v1/functions/any/invoke", content=empty(shape), headers=headers)
    assert r.status_code == 413, r.text[:200]  # was 47 s and a 400 MB answer
    assert what in error_of(r)["error"]
    healthy(server)


def test_a_json_body_past_its_own_limit_points_to_msgpack(server: LiveServer) -> None:
    rows = [[1.5, 2.5, 3.5, 4.5]] * 5000  # about 100 kB of JSON: over 64 KiB, under 64 MiB
    with server.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"x": rows})
    assert r.status_code == 413
    assert "msgpack" in error_of(r)["error"]
    healthy(server)


def oip(server: LiveServer, header: dict[str, object], binary: bytes = b"") -> tuple[int, str]:
    head = json.dumps(header).encode()
    headers = {"inference-header-content-length": str(len(head))}
    with server.client() as c:
        r = c.post("/v2/models/any/infer", content=head + binary, headers=headers)
    return r.status_code, r.json()["error"]


def test_oip_bytes_elements_are_counted_against_the_bytes_sent(server: LiveServer) -> None:
    entry = {"name": "x", "datatype": "BYTES", "shape": [60_000_000]}
    status, error = oip(server, {"inputs": [entry | {"parameters": {"binary_data_size": 0}}]})
    assert status == 400  # refused before an object array of 60 M elements was made
    assert "60000000 BYTES elements need at least 240000000 bytes" in error
    huge = {"name": "x", "datatype": "BYTES", "shape": [2**34], "parameters": {}}
    status, error = oip(server, {"inputs": [huge | {"parameters": {"binary_data_size": 0}}]})
    assert status == 413  # was a 500
    status, _ = oip(server, {"inputs": [huge | {"data": []}]})
    assert status == 413
    healthy(server)


def test_oip_shapes_are_checked_against_the_manifest_before_the_data(server: LiveServer) -> None:
    entry = {"name": "x", "datatype": "FP32", "shape": [1, 5], "parameters": {}}
    head = json.dumps({"inputs": [entry | {"parameters": {"binary_data_size": 20}}]}).encode()
    headers = {"inference-header-content-length": str(len(head))}
    with server.client() as c:
        r = c.post("/v2/models/echo/infer", content=head + bytes(20), headers=headers)
    assert r.status_code == 422
    assert "expected shape [-1, 4]" in r.json()["error"]
