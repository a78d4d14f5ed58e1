"""The split routes over a real socket: plan data, heads, tails, and their errors."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from fnrt.edge.activation import Encoding, pack, read_outputs
from fnrt.edge.client import EdgeClient, EdgeConfig
from fnrt.functions.errors import InvalidInput, NoSuchSplit
from fnrt.runtime.clock import ManualClock
from support import LiveServer, error_of, live_server, publish, write_function

MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
X = np.random.default_rng(3).random((1, 3, 32, 32), dtype=np.float32)


def deploy(srv: LiveServer, folder: Path) -> str:
    return srv.deploy(folder).version


def head_activation(srv: LiveServer, k: int, x: np.ndarray = X) -> np.ndarray:
    with srv.client() as c:
        model = c.get(f"/v1/functions/cnn-split/split/{k}/head").content
    (out,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return np.asarray(out)


def test_the_plan_names_points_heads_and_server_time(tmp_path: Path, cnn: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        version = deploy(srv, cnn)
        r = c.get("/v1/functions/cnn-split/split")
        assert r.status_code == 200, r.text
        plan = r.json()
        assert plan["version"] == version and plan["splits"] == 8
        assert [p["name"] for p in plan["points"]][2] == "after.5"
        assert plan["inputs"] == [
            {"name": "x", "dtype": "float32", "row_shape": [3, 32, 32], "row_bytes": 12288}
        ]
        assert plan["output_row_bytes"] == 40 and plan["outputs"] == ["y"]
        assert len(plan["server_ms"]) == 7 and all(t >= 0 for t in plan["server_ms"])
        assert [h["k"] for h in plan["heads"]] == list(range(1, 8))
        for head in plan["heads"]:
            got = c.get(f"/v1/functions/cnn-split/split/{head['k']}/head")
            assert got.status_code == 200
            assert hashlib.sha256(got.content).hexdigest() == head["digest"]
            assert got.headers["x-fnrt-digest"] == f"sha256:{head['digest']}"
            assert len(got.content) == head["size_bytes"]


def test_a_tail_answers_like_the_whole_model(tmp_path: Path, cnn: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        version = deploy(srv, cnn)
        whole = c.post("/v1/functions/cnn-split/invoke", json={"x": X.tolist()}).json()["y"]
        for k in (0, 3, 6):
            activation = X if k == 0 else head_activation(srv, k)
            r = c.post(
                f"/v1/functions/cnn-split/split/{k}", content=pack(activation), headers=MSGPACK
            )
            assert r.status_code == 200, error_of(r)
            assert r.headers["x-fnrt-version"] == version
            assert float(r.headers["x-fnrt-server-ms"]) >= 0
            np.testing.assert_allclose(read_outputs(r.content)["y"], whole, atol=1e-5)


def test_tails_of_the_same_split_share_batches(tmp_path: Path, cnn: Path) -> None:
    folder = tmp_path / "cnn-split"
    shutil.copytree(cnn, folder)
    toml = folder / "fnrt.toml"
    toml.write_text(
        toml.read_text().replace("max_batch_size = 16", "max_batch_size = 16\nmax_wait_ms = 100")
    )
    with live_server(tmp_path) as srv:
        deploy(srv, folder)
        bodies = {k: pack(head_activation(srv, k)) for k in (2, 3)}

        def send(i: int) -> int:
            k = (2, 3)[i % 2]
            with srv.client() as c:
                r = c.post(f"/v1/functions/cnn-split/split/{k}", content=bodies[k], headers=MSGPACK)
                return r.status_code

        with ThreadPoolExecutor(16) as pool:
            assert set(pool.map(send, range(32))) == {200}
        tails = srv.node.splits.schedulers()
        assert len(tails) == 2  # one per split: splits never share a batch
        for tail in tails:
            assert tail.stats.requests == 16
            assert max(tail.stats.batch_sizes) > 1, dict(tail.stats.batch_sizes)


SPLIT = "/v1/functions/cnn-split/split"
JSON = {"content-type": "application/json"}
GONE = {**MSGPACK, "x-fnrt-version": "v-000000000000"}
WIDE = np.zeros((1, 16, 32, 32), np.float32)  # 64 KiB: over the 48 KiB limit below


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        ("/v1/functions/nope/split/1", pack(X), MSGPACK, 404, "not deployed"),
        (f"{SPLIT}/x", pack(X), MSGPACK, 400, "not an integer"),
        (f"{SPLIT}/-1", pack(X), MSGPACK, 400, "negative"),
        (f"{SPLIT}/7", pack(X), MSGPACK, 404, "no tail here (0 to 6)"),
        (f"{SPLIT}/3", pack(X), MSGPACK, 422, "must have shape [n, 8, 8, 8]"),
        (f"{SPLIT}/0", b"\xc1junk", MSGPACK, 400, "not valid msgpack"),
        (f"{SPLIT}/0", b"{}", JSON, 415, "application/msgpack"),
        (f"{SPLIT}/0", pack(X), GONE, 404, "no version"),
        (f"{SPLIT}/1", pack(WIDE), MSGPACK, 413, "larger than"),
        ("/v1/functions/plain/split/0", pack(X), MSGPACK, 404, "no split points"),
    ],
)
def test_bad_split_requests_get_clear_errors_and_the_server_keeps_serving(
    tmp_path: Path,
    cnn: Path,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    message: str,
) -> None:
    with live_server(tmp_path, max_body_bytes=48 * 1024) as srv, srv.client() as c:
        deploy(srv, cnn)
        deploy(srv, write_function(tmp_path / "src", "plain"))
        r = c.post(path, content=body, headers=headers)
        assert r.status_code == status, error_of(r)
        assert message in error_of(r)["error"]
        ok = c.post(
            "/v1/functions/cnn-split/split/0", content=pack(X, Encoding.FLOAT16), headers=MSGPACK
        )
        assert ok.status_code == 200


def test_head_and_plan_errors(tmp_path: Path, cnn: Path) -> None:
    with live_server(tmp_path) as srv, srv.client() as c:
        deploy(srv, cnn)
        deploy(srv, write_function(tmp_path / "src", "plain"))
        assert c.get("/v1/functions/cnn-split/split/0/head").status_code == 404
        assert c.get("/v1/functions/cnn-split/split/8/head").status_code == 404
        assert c.get("/v1/functions/cnn-split/split/one/head").status_code == 400
        r = c.get("/v1/functions/plain/split")
        assert r.status_code == 404 and "no split points" in r.json()["error"]
        assert c.get("/v1/functions/nope/split").status_code == 404
        assert c.post("/v1/probe", content=bytes(4096)).status_code == 204


def test_a_pinned_version_keeps_its_tail_across_a_redeploy(tmp_path: Path, cnn: Path) -> None:
    folder = tmp_path / "cnn-split"
    shutil.copytree(cnn, folder)
    with live_server(tmp_path) as srv, srv.client() as c:
        first = deploy(srv, folder)
        activation = pack(head_activation(srv, 3))
        toml = folder / "fnrt.toml"
        toml.write_text(toml.read_text().replace("max_batch_size = 16", "max_batch_size = 8"))
        second = deploy(srv, folder)
        assert (
            second != first and c.get("/v1/functions/cnn-split/split").json()["version"] == second
        )
        pinned = {**MSGPACK, "x-fnrt-version": first}
        r = c.post("/v1/functions/cnn-split/split/3", content=activation, headers=pinned)
        assert r.status_code == 200 and r.headers["x-fnrt-version"] == first


def test_idle_tails_scale_to_zero(tmp_path: Path, cnn: Path) -> None:
    clock = ManualClock()
    with live_server(tmp_path, clock) as srv, srv.client() as c:
        deploy(srv, cnn)
        r = c.post("/v1/functions/cnn-split/split/0", content=pack(X), headers=MSGPACK)
        assert r.status_code == 200
        (tail,) = srv.node.splits.schedulers()
        assert tail.pool.instances == 1
        clock.advance(301)  # past keep_alive_s
        srv.call(srv.node.sweeper.sweep())
        assert tail.pool.instances == 0
        r = c.post("/v1/functions/cnn-split/split/0", content=pack(X), headers=MSGPACK)
        assert r.status_code == 200 and r.headers.get("x-fnrt-cold-start") == "l2"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (('"after.5", "after.7"', '"after.7", "after.5"'), "from the input to the output"),
        (('"after.14"]', '"after.14", "nope"]'), "'nope' is not a tensor of the model"),
    ],
)
def test_a_version_that_cannot_be_cut_is_rejected_at_deploy(
    tmp_path: Path, cnn: Path, change: tuple[str, str], reason: str
) -> None:
    folder = tmp_path / "cnn-split"
    shutil.copytree(cnn, folder)
    with live_server(tmp_path) as srv, srv.client() as c:
        good = deploy(srv, folder)
        toml = folder / "fnrt.toml"
        toml.write_text(toml.read_text().replace(*change))
        vm = publish(srv.node.repository, folder)
        r = c.post("/v1/functions", json=vm.to_dict())
        assert r.status_code == 422 and reason in r.json()["reason"], r.json()
        assert c.get("/v1/functions/cnn-split/split").json()["version"] == good


def test_tails_of_a_retired_version_close_once_idle(tmp_path: Path, cnn: Path) -> None:
    folder = tmp_path / "cnn-split"
    shutil.copytree(cnn, folder)
    clock = ManualClock()
    with live_server(tmp_path, clock) as srv, srv.client() as c:
        first = deploy(srv, folder)
        r = c.post("/v1/functions/cnn-split/split/0", content=pack(X), headers=MSGPACK)
        assert r.status_code == 200
        toml = folder / "fnrt.toml"
        toml.write_text(toml.read_text().replace("max_batch_size = 16", "max_batch_size = 8"))
        second = deploy(srv, folder)
        clock.advance(601)  # past the rollback window (and the tail's keep-alive)
        srv.call(srv.node.sweeper.sweep())
        assert srv.node.splits.schedulers() == []  # the first version's tail is gone
        r = c.post("/v1/functions/cnn-split/split/0", content=pack(X), headers=MSGPACK)
        assert r.headers["x-fnrt-version"] == second != first
        (tail,) = srv.node.splits.schedulers()
        assert tail.version.version == second


#: A token model: int64 ids [n, 4] of a vocabulary of 5,000 through an embedding to
#: y [n, 3], split at the embedding; its graph has an output the manifest leaves out.
TOKENS_MODEL = """
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
table = numpy_helper.from_array(rng.standard_normal((5000, 8)).astype(np.float32), "table")
w = numpy_helper.from_array(rng.standard_normal((32, 3)).astype(np.float32), "w")
nodes = [
    helper.make_node("Gather", ["table", "ids"], ["gathered"], axis=0),
    helper.make_node("Flatten", ["gathered"], ["emb"], axis=1),
    helper.make_node("MatMul", ["emb", "w"], ["y"]),
    helper.make_node("Relu", ["y"], ["extra"]),
]
graph = helper.make_graph(
    nodes,
    "tokens",
    [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", 4])],
    [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
        helper.make_tensor_value_info("extra", TensorProto.FLOAT, ["n", 3]),
    ],
    [table, w],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, sys.argv[1])
"""

TOKENS_HANDLER = """
import numpy as np

class Tokens:
    def load(self, artifacts, device):
        self.session = artifacts["model"].onnx_session(device)

    def __call__(self, batch):
        ids = np.concatenate([r["ids"] for r in batch])
        (y,) = self.session.run(["y"], {"ids": ids})
        return [{"y": y[i : i + 1]} for i in range(len(batch))]
"""

TOKENS_MANIFEST = """
name = "{name}"
handler = "handler:Tokens"

[artifacts]
model = "model.onnx"

[inputs]
ids = {{ dtype = "int64", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 3] }}

[split]
model = "model"
points = ["emb"]
"""

IDS = np.array([[4095, 3001, 2049, 17]], np.int64)


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    folder = write_function(tmp_path / "src", "tokens", TOKENS_HANDLER, TOKENS_MANIFEST)
    script = tmp_path / "make_model.py"
    script.write_text(TOKENS_MODEL)
    subprocess.run([sys.executable, str(script), str(folder / "model.onnx")], check=True)
    return folder


def test_token_ids_at_split_0_are_exact_whatever_the_encoding_or_refused(
    tmp_path: Path, tokens: Path
) -> None:
    """An integer input travels as it is (rounded to float16 or quantised to int8, ids
    past 2,048 changed: other embeddings, no error); a float activation for it is a
    422, not cast; and the graph's output the manifest leaves out is not answered."""
    with live_server(tmp_path / "srv") as srv, srv.client() as c:
        deploy(srv, tokens)
        whole = c.post("/v1/functions/tokens/invoke", json={"ids": IDS.tolist()})
        assert whole.status_code == 200, whole.text
        expected = np.asarray(whole.json()["y"], np.float32)
        for encoding in Encoding:
            r = c.post("/v1/functions/tokens/split/0", content=pack(IDS, encoding), headers=MSGPACK)
            assert r.status_code == 200, (encoding, r.text)
            outputs = read_outputs(r.content)
            assert set(outputs) == {"y"}
            np.testing.assert_allclose(outputs["y"], expected, rtol=1e-5)
        floats = pack(IDS.astype(np.float32) + 0.4)
        r = c.post("/v1/functions/tokens/split/0", content=floats, headers=MSGPACK)
        assert r.status_code == 422 and "must be int64" in error_of(r)["error"]


def test_a_functions_keys_guard_its_plan_and_heads_and_the_edge_client_sends_one(
    tmp_path: Path, cnn: Path
) -> None:
    """A head is the model's first layers (split n + 1: all of it): with invoke keys,
    the plan and the heads need one, as the tails do."""
    keys = tmp_path / "keys.json"
    keys.write_text('{"cnn-split": ["k-secret"]}')
    with live_server(tmp_path / "srv", invoke_keys_file=keys) as srv, srv.client() as c:
        deploy(srv, cnn)
        assert c.get("/v1/functions/cnn-split/split").status_code == 401
        assert c.get("/v1/functions/cnn-split/split/7/head").status_code == 401
        bearer = {"authorization": "Bearer k-secret"}
        assert c.get("/v1/functions/cnn-split/split/7/head", headers=bearer).status_code == 200
        config = EdgeConfig(cache_dir=tmp_path / "edge", profile_runs=1)
        with EdgeClient(srv.url, "cnn-split", config, key="k-secret") as client:
            assert client.run({"x": X}, split=3).outputs["y"].shape == (1, 10)


#: A model of two inputs, a and b [n, 4], added first: split at "hidden" or "act".
PAIR_MODEL = """
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(1)
w1 = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1")
w2 = numpy_helper.from_array(rng.standard_normal((8, 2)).astype(np.float32), "w2")
nodes = [
    helper.make_node("Add", ["a", "b"], ["sum"]),
    helper.make_node("MatMul", ["sum", "w1"], ["hidden"]),
    helper.make_node("Relu", ["hidden"], ["act"]),
    helper.make_node("MatMul", ["act", "w2"], ["y"]),
]
inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in "ab"]
graph = helper.make_graph(
    nodes, "pair", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
    [w1, w2],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, sys.argv[1])
"""

PAIR_HANDLER = """
import numpy as np

class Pair:
    def load(self, artifacts, device):
        self.session = artifacts["model"].onnx_session(device)

    def __call__(self, batch):
        feed = {n: np.concatenate([r[n] for r in batch]) for n in ("a", "b")}
        (y,) = self.session.run(["y"], feed)
        return [{"y": y[i : i + 1]} for i in range(len(batch))]
"""

PAIR_MANIFEST = """
name = "{name}"
handler = "handler:Pair"

[artifacts]
model = "model.onnx"

[inputs]
a = {{ dtype = "float32", shape = [-1, 4] }}
b = {{ dtype = "float32", shape = [-1, 4] }}

[outputs]
y = {{ dtype = "float32", shape = [-1, 2] }}

[split]
model = "model"
points = ["hidden", "act"]
"""


def test_a_model_of_two_inputs_deploys_and_splits_after_them(tmp_path: Path) -> None:
    """Its server profile feeds both inputs at split 0 (it fed one, and the deploy
    failed); a device plans among the splits after the inputs (split 0 would send two
    tensors: the server refuses it with a 404 that says so) and gets the model's answer."""
    folder = write_function(tmp_path / "src", "pair", PAIR_HANDLER, PAIR_MANIFEST)
    script = tmp_path / "make_model.py"
    script.write_text(PAIR_MODEL)
    subprocess.run([sys.executable, str(script), str(folder / "model.onnx")], check=True)
    rng = np.random.default_rng(2)
    a, b = (rng.random((1, 4), dtype=np.float32) for _ in range(2))
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    (expected,) = session.run(["y"], {"a": a, "b": b})
    with live_server(tmp_path / "srv") as srv, srv.client() as c:
        deploy(srv, folder)
        plan = c.get("/v1/functions/pair/split").json()
        assert [p["name"] for p in plan["inputs"]] == ["a", "b"]
        r = c.post("/v1/functions/pair/split/0", content=pack(a), headers=MSGPACK)
        assert r.status_code == 404 and "one input" in error_of(r)["error"]
        config = EdgeConfig(cache_dir=tmp_path / "edge", profile_runs=1)
        with EdgeClient(srv.url, "pair", config) as client:
            result = client.run({"a": a, "b": b})
            assert result.split != 0
            np.testing.assert_allclose(result.outputs["y"], expected, rtol=1e-5)
            for k in (1, 2, 3):
                np.testing.assert_allclose(
                    client.run({"a": a, "b": b}, split=k).outputs["y"], expected, rtol=1e-5
                )
            with pytest.raises(InvalidInput, match="as many rows each"):
                client.run({"a": a, "b": np.concatenate([b, b])}, split=1)
        tiny = EdgeConfig(cache_dir=tmp_path / "tiny", profile_runs=1, max_model_bytes=0)
        with (  # no head fits, and no split 0
            EdgeClient(srv.url, "pair", tiny) as client,
            pytest.raises(NoSuchSplit, match="no split fits this device"),
        ):
            client.run({"a": a, "b": b})
