"""tritonclient's HTTP client, unchanged, against a real fnrt server on 127.0.0.1.

tritonclient sends binary inputs and asks for binary outputs by default, sends
no Content-Type, and raises InferenceServerException with the server's status
and message: all of it is exercised here, for every datatype.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from support import LiveServer, gate, live_server, publish, write_function

TYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
    "BYTES": np.object_,
}
DTYPE_NAMES = {
    "BOOL": "bool",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BF16": "bfloat16",
    "BYTES": "bytes",
}

IDENTITY = """
class Identity:
    def __call__(self, batch):
        return [{name + "_out": value for name, value in r.items()} for r in batch]
"""


def identity_manifest() -> str:
    lines = ['name = "{name}"', 'handler = "handler:Identity"', "", "[inputs]"]
    names = {t: DTYPE_NAMES.get(t, t.lower()) for t in TYPES}
    lines += [f'{t.lower()} = {{{{ dtype = "{n}", shape = [-1, 3] }}}}' for t, n in names.items()]
    lines += ["", "[outputs]"]
    lines += [
        f'{t.lower()}_out = {{{{ dtype = "{n}", shape = [-1, 3] }}}}' for t, n in names.items()
    ]
    return "\n".join(lines) + "\n"


def sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array(
            [[b"a", "\u00e9t\u00e9".encode(), b""], [b"\x00\x01", b"xyz", b"q"]], dtype=object
        )
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    values = np.array([[1, 2, 3], [4, 5, 126]])
    if datatype.startswith(("FP", "BF")):
        values = values / 4
    return values.astype(TYPES[datatype])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("triton")
    with live_server(tmp) as srv:
        for folder in (
            write_function(tmp / "src", "echo"),
            write_function(tmp / "src", "types", IDENTITY, identity_manifest()),
        ):
            srv.deploy(folder)
        yield srv


@pytest.fixture
def client(server: LiveServer) -> Iterator[th.InferenceServerClient]:
    c = th.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


def test_health_and_metadata(client: th.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "fnrt"
    assert "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("echo")
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert model["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    assert client.is_model_ready("echo")
    assert not client.is_model_ready("nope")
    config = client.get_model_config("echo")
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4]}]


def _inputs(binary: bool) -> list[th.InferInput]:
    out = []
    for datatype in TYPES:
        tensor = th.InferInput(datatype.lower(), [2, 3], datatype)
        # tritonclient itself refuses BF16 as JSON (test_wire covers that path)
        tensor.set_data_from_numpy(sample(datatype), binary_data=binary or datatype == "BF16")
        out.append(tensor)
    return out


@pytest.mark.parametrize(
    ("binary_in", "binary_out"), [(True, True), (False, False), (True, False), (False, True)]
)
def test_every_datatype_round_trips(
    client: th.InferenceServerClient, binary_in: bool, binary_out: bool
) -> None:
    outputs = [th.InferRequestedOutput(f"{t.lower()}_out", binary_data=binary_out) for t in TYPES]
    result = client.infer("types", _inputs(binary_in), outputs=outputs, request_id="r-1")
    response = result.get_response()
    assert response["id"] == "r-1"
    assert response["model_name"] == "types"
    for datatype in TYPES:
        got = result.as_numpy(f"{datatype.lower()}_out")
        want = sample(datatype)
        if datatype == "BYTES" and not binary_out:  # tritonclient gives JSON text as str
            got = np.vectorize(lambda v: v.encode(), otypes=[object])(got)
        assert got.shape == (2, 3), datatype
        assert got.dtype == np.dtype(TYPES[datatype]), datatype
        np.testing.assert_array_equal(got, want, err_msg=datatype)


def test_bytes_that_are_not_text_travel_binary_only(client: th.InferenceServerClient) -> None:
    raw = np.array([[b"\xff\xfe", b"ok", b"\x80"]], dtype=object)
    inputs = []
    for datatype in TYPES:
        tensor = th.InferInput(datatype.lower(), [1, 3], datatype)
        tensor.set_data_from_numpy(raw if datatype == "BYTES" else sample(datatype)[:1])
        inputs.append(tensor)
    result = client.infer("types", inputs)
    np.testing.assert_array_equal(result.as_numpy("bytes_out"), raw)
    with pytest.raises(InferenceServerException) as raised:
        client.infer(
            "types", inputs, outputs=[th.InferRequestedOutput("bytes_out", binary_data=False)]
        )
    assert raised.value.status() == "400"
    assert "not UTF-8" in raised.value.message()


def test_default_request_is_binary_both_ways(client: th.InferenceServerClient) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = th.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("echo", [tensor])
    out = result.get_output("y")
    assert out["parameters"]["binary_data_size"] == 32
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    assert result.get_response()["model_version"].startswith("v-")


@pytest.mark.parametrize("request_coding", ["gzip", "deflate", None])
@pytest.mark.parametrize("response_coding", ["gzip", "deflate", None])
def test_compression(
    client: th.InferenceServerClient, request_coding: str | None, response_coding: str | None
) -> None:
    x = np.linspace(0, 1, 400, dtype=np.float32).reshape(100, 4)
    tensor = th.InferInput("x", [100, 4], "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer(
        "echo",
        [tensor],
        request_compression_algorithm=request_coding,
        response_compression_algorithm=response_coding,
    )
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)


def test_a_version_is_served_by_its_id(
    server: LiveServer, client: th.InferenceServerClient, tmp_path: Path
) -> None:
    first = client.get_model_metadata("echo")["versions"]
    doubled = first[0] if len(first) == 1 else None
    tripled = write_function(
        tmp_path,
        "echo",
        handler="""
class Echo:
    def __call__(self, batch):
        return [{"y": r["x"] * 3} for r in batch]
""",
    )
    vm = publish(server.node.repository, tripled)
    server.call(server.node.deployer.deploy(vm))
    try:
        tensor = th.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("echo", [tensor]).as_numpy("y")[0, 0] == 3  # routed: the new one
        assert doubled is not None
        old = client.infer("echo", [tensor], model_version=doubled)
        assert old.as_numpy("y")[0, 0] == 2  # the old version, by id
        assert old.get_response()["model_version"] == doubled
        assert client.is_model_ready("echo", doubled)
        assert client.get_model_metadata("echo", doubled)["versions"] == [doubled]
        stats = client.get_inference_statistics("echo", doubled)["model_stats"]
        assert [s["version"] for s in stats] == [doubled]
        with pytest.raises(InferenceServerException) as raised:
            client.infer("echo", [tensor], model_version="v-000000000000")
        assert raised.value.status() == "404"
    finally:
        server.call(
            server.node.deployer.deploy(server.node.repository.get_version("echo", doubled))
        )


@pytest.mark.parametrize(
    ("call", "status", "words"),
    [
        (lambda c, t: c.infer("nope", [t]), "404", "function 'nope' is not deployed"),
        (
            lambda c, t: c.infer("echo", [t], outputs=[th.InferRequestedOutput("z")]),
            "400",
            "output 'z'",
        ),
        (lambda c, t: c.infer("types", [t]), "422", "missing input"),
        (lambda c, t: c.get_model_metadata("nope"), "404", "not deployed"),
    ],
)
def test_errors_raise_with_the_servers_status_and_message(
    client: th.InferenceServerClient,
    call,
    status: str,
    words: str,  # type: ignore[no-untyped-def]
) -> None:
    tensor = th.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as raised:
        call(client, tensor)
    assert raised.value.status() == status
    assert words in raised.value.message()


def test_wrong_shape_and_datatype_name_the_input(client: th.InferenceServerClient) -> None:
    tensor = th.InferInput("x", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("echo", [tensor])
    assert raised.value.status() == "422"
    assert "input 'x': expected shape [-1, 4], got [1, 3]" in raised.value.message()
    tensor = th.InferInput("x", [1, 4], "FP64")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float64))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("echo", [tensor])
    assert "expected datatype FP32, got FP64" in raised.value.message()
    assert client.is_server_live()  # and it keeps serving


def test_statistics_count_requests_and_batches(
    client: th.InferenceServerClient, server: LiveServer
) -> None:
    before = client.get_inference_statistics("echo")["model_stats"][0]
    tensor = th.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    for _ in range(3):
        client.infer("echo", [tensor])
    after = client.get_inference_statistics("echo")["model_stats"][0]
    assert (
        after["inference_stats"]["success"]["count"]
        == before["inference_stats"]["success"]["count"] + 3
    )
    assert after["execution_count"] == before["execution_count"] + 3
    assert after["inference_stats"]["queue"]["ns"] > before["inference_stats"]["queue"]["ns"]
    assert after["last_inference"] >= before["last_inference"]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert sizes[1] >= 3
    every = client.get_inference_statistics()["model_stats"]
    assert {"echo", "types"} <= {s["name"] for s in every}


def test_repository_load_and_unload_map_onto_warm_and_scale_to_zero(
    client: th.InferenceServerClient, server: LiveServer
) -> None:
    scheduler = server.call(server.registry.get("echo"))
    client.load_model("echo")
    assert scheduler.pool.state.value == "warm"
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["echo"]["state"] == "READY"
    assert index["echo"]["version"] == scheduler.version.version
    client.unload_model("echo")
    assert scheduler.pool.state.value == "cold"
    assert (
        "scaled to zero"
        in {e["name"]: e for e in client.get_model_repository_index()}["echo"]["reason"]
    )
    assert client.is_model_ready("echo")  # it still answers: the next request loads it
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("echo", config='{"max_batch_size": 4}')
    assert raised.value.status() == "400"


def test_infers_ride_the_same_batches_as_v1_invokes(tmp_path: Path) -> None:
    gated = """
import fnrt_test_gates

class Gated:
    def __call__(self, batch):
        fnrt_test_gates.gate("running").set()
        fnrt_test_gates.gate("go").wait(30)
        fnrt_test_gates.sizes.append(len(batch))
        return [{"y": r["x"] * 2} for r in batch]
"""
    import support

    support.gates.sizes = []  # type: ignore[attr-defined]
    folder = write_function(
        tmp_path / "src",
        "gated",
        gated,
        manifest=support.ECHO_MANIFEST.replace("handler:Echo", "handler:Gated"),
    )
    from concurrent.futures import ThreadPoolExecutor

    with live_server(tmp_path) as srv:
        srv.deploy(folder)
        c = th.InferenceServerClient(srv.url.removeprefix("http://"), concurrency=4)
        tensor = th.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        with ThreadPoolExecutor(8) as pool, srv.client() as http:
            first = pool.submit(http.post, "/v1/functions/gated/invoke", json={"x": [[1, 1, 1, 1]]})
            assert gate("running").wait(30)  # the first batch holds the instance
            scheduler = srv.call(srv.registry.get("gated"))
            infers = [pool.submit(c.infer, "gated", [tensor]) for _ in range(3)]
            invokes = [
                pool.submit(http.post, "/v1/functions/gated/invoke", json={"x": [[1, 1, 1, 1]]})
                for _ in range(2)
            ]
            support.wait_until(lambda: scheduler.batcher.queued == 5)
            gate("go").set()
            assert first.result(30).status_code == 200
            for f in infers:
                np.testing.assert_array_equal(
                    f.result(30).as_numpy("y"), np.full((1, 4), 2, np.float32)
                )
            for f in invokes:
                assert f.result(30).json() == {"y": [[2, 2, 2, 2]]}
        c.close()
    assert support.gates.sizes == [1, 5]  # type: ignore[attr-defined]
