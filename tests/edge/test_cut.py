"""Cutting ONNX models at their split points: heads and tails compose to the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from fnrt.edge.activation import Encoding, pack, unpack
from fnrt.edge.cut import Cuts
from fnrt.functions.errors import ManifestError
from fnrt.functions.manifest import load_manifest

#: Tolerances of the compressed encodings, relative to the largest output.
TOLERANCE = {Encoding.FLOAT32: 1e-5, Encoding.FLOAT16: 1e-2, Encoding.INT8: 5e-2}


def run(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    (out,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)
    return np.asarray(out)


@pytest.fixture(scope="module")
def cuts(cnn: Path, tmp_path_factory: pytest.TempPathFactory) -> Cuts:
    points = load_manifest(cnn).split.points
    return Cuts(cnn / "model.onnx", points, tmp_path_factory.mktemp("cuts"))


def test_points_carry_their_shapes(cuts: Cuts) -> None:
    assert cuts.count == 8
    assert [p.row_shape for p in cuts.points] == [
        (16, 32, 32), (16, 16, 16), (8, 8, 8), (128, 8, 8), (128, 4, 4), (256,),
    ]  # fmt: skip
    assert cuts.points[2].row_bytes == 2048
    assert cuts.input_points[0].row_bytes == 3 * 32 * 32 * 4


@pytest.mark.parametrize("encoding", list(Encoding))
def test_every_split_gives_the_full_models_result(cuts: Cuts, encoding: Encoding) -> None:
    x = np.random.default_rng(1).random((3, 3, 32, 32), dtype=np.float32)
    full = run(cuts.model_path, {"x": x})
    scale = float(np.abs(full).max())
    for k in range(cuts.count - 1):  # the last split is the full model itself
        activation = x if k == 0 else run(cuts.head(k), {"x": x})
        point = cuts.sent(k) or cuts.input_points[0]
        sent = unpack(pack(activation, encoding))  # what the server gets
        y = run(cuts.tail(k), {point.name: sent})
        error = float(np.abs(y - full).max())
        assert error <= TOLERANCE[encoding] * max(scale, 1.0), (k, encoding, error)
    assert np.array_equal(run(cuts.head(cuts.count - 1), {"x": x}), full)


def test_cut_models_are_written_once(cuts: Cuts) -> None:
    first = cuts.head(2)
    stamp = first.stat().st_mtime_ns
    assert cuts.head(2) == first and first.stat().st_mtime_ns == stamp
    assert not list(first.parent.glob(".*"))  # no temporary files left behind


def test_split_indices_out_of_range_are_refused(cuts: Cuts) -> None:
    with pytest.raises(ValueError, match="no head"):
        cuts.head(0)
    with pytest.raises(ValueError, match="no tail"):
        cuts.tail(cuts.count - 1)


def skip_model(path: Path) -> Path:
    """x -> relu -> a -> relu -> b; y = a + b (a skip connection over b)."""
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["n", 4]) for n in ("x", "y")]
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="r1"),
            helper.make_node("Relu", ["a"], ["b"], name="r2"),
            helper.make_node("Add", ["a", "b"], ["y"], name="add"),
        ],
        "skip",
        [info[0]],
        [info[1]],
    )
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_a_point_a_skip_connection_crosses_is_refused(tmp_path: Path) -> None:
    model = skip_model(tmp_path / "skip.onnx")
    Cuts(model, ("a",), tmp_path / "ok")  # everything after 'a' reads only 'a'
    with pytest.raises(ManifestError, match="'b' does not cut the model: add after it reads 'a'"):
        Cuts(model, ("b",), tmp_path / "bad")


@pytest.mark.parametrize(
    ("points", "message"),
    [
        (("nope",), "'nope' is not a tensor of the model"),
        (("b", "a"), "from the input to the output"),
    ],
)
def test_bad_points_are_named(tmp_path: Path, points: tuple[str, ...], message: str) -> None:
    model = skip_model(tmp_path / "skip.onnx")
    with pytest.raises(ManifestError, match=message):
        Cuts(model, points, tmp_path / "cuts")


def test_a_variable_length_input_is_blamed_on_the_model_not_the_points(tmp_path: Path) -> None:
    """A model input of variable length ([n, t] tokens) cannot be split: the error names
    the model's input and the field the model comes from, not the split points."""
    graph = helper.make_graph(
        [  # the mean over the tokens: 'a' has a fixed shape, [n, 1]
            helper.make_node("ReduceMean", ["x"], ["a"], axes=[1], keepdims=1),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        "tokens",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
    )
    path = tmp_path / "tokens.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    with pytest.raises(ManifestError) as raised:
        Cuts(path, ("a",), tmp_path / "cuts")
    assert raised.value.fields["field"] == "split.model"
    assert "model input 'x' must have a fixed shape after the batch dimension" in str(raised.value)
