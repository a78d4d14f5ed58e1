"""Shape and response bounds, checked before anything is allocated or encoded."""

from __future__ import annotations

import msgpack
import numpy as np
import orjson
import pytest

from fnrt.functions.codec import Format, decode, decode_msgpack, encode
from fnrt.functions.errors import ResponseTooLarge, TensorTooLarge
from fnrt.functions.limits import TensorLimits, cells, check_shape, json_bytes


def empty_array(shape: list[int]) -> dict[str, object]:
    return {"nd": True, "type": "<f4", "kind": "", "shape": shape, "data": b""}


def test_cells_count_a_zero_dimension_as_one() -> None:
    assert cells([134217728, 0]) == 134217728
    assert cells([2, 3, 0, 4]) == 24
    assert cells([]) == 1


def test_a_few_bytes_cannot_declare_a_huge_empty_array() -> None:
    body = msgpack.packb({"x": empty_array([134217728, 0])})
    assert len(body) < 64
    with pytest.raises(TensorTooLarge, match="134217728"):
        decode_msgpack(body)


def test_too_many_dimensions_are_refused() -> None:
    with pytest.raises(TensorTooLarge, match="33 dimensions"):
        check_shape("x", [1] * 33, TensorLimits())


def test_the_server_limit_is_the_one_applied() -> None:
    body = msgpack.packb({"x": empty_array([1000, 0])})
    assert decode_msgpack(body)["x"].shape == (1000, 0)
    with pytest.raises(TensorTooLarge):
        decode_msgpack(body, TensorLimits(max_elements=999))


def test_a_refused_msgpack_array_names_its_input() -> None:
    # msgpack decodes the array before the map that names it: the refusal still says
    # which input it was (the body's error and its `input` field)
    body = msgpack.packb({"a": empty_array([3, 0]), "x": {"deep": [empty_array([1000, 3])]}})
    with pytest.raises(TensorTooLarge) as info:
        decode_msgpack(body, TensorLimits(max_elements=100))
    assert str(info.value).startswith("input 'x' of shape [1000, 3]: more than the server's")
    assert info.value.fields["input"] == "x"
    deep = msgpack.packb({"y": empty_array([1] * 40)})
    with pytest.raises(
        TensorTooLarge, match=r"^input 'y' of shape \[1, .*40 dimensions, the limit"
    ):
        decode(deep, Format.MSGPACK)


def test_a_json_body_is_held_to_the_element_limit_too() -> None:
    limits = TensorLimits(max_elements=100)
    body = orjson.dumps({"x": [[1.0, 2.0, 3.0]] * 200})
    with pytest.raises(TensorTooLarge) as info:
        decode(body, Format.JSON, limits)
    assert str(info.value).startswith("input 'x' of shape [200, 3]: more than the server's limit")
    assert decode(orjson.dumps({"x": [[1.0, 2.0, 3.0]] * 33}), Format.JSON, limits)["x"]
    # a body no longer than the limit cannot hold more cells than that: not walked
    short = orjson.dumps({"x": [[1, 2, 3]] * 5})
    assert len(short) <= 100 and decode(short, Format.JSON, limits)["x"] == [[1, 2, 3]] * 5
    long = orjson.dumps({"x": [1] * 101})
    with pytest.raises(TensorTooLarge, match=r"^input 'x' of shape \[101\]"):
        decode(long, Format.JSON, limits)


def test_a_json_answer_is_sized_before_it_is_encoded() -> None:
    huge_empty = np.zeros((67108864, 0), dtype=np.float32)  # no bytes, 64 Mi lists as JSON
    with pytest.raises(ResponseTooLarge, match="msgpack"):
        encode({"y": huge_empty}, Format.JSON)
    assert len(encode({"y": huge_empty}, Format.MSGPACK)) < 100  # tiny as msgpack


def test_response_limit_counts_the_format() -> None:
    y = np.ones((1000, 100), dtype=np.float32)  # 400 kB binary, about 1.6 MB as JSON
    limits = TensorLimits(max_response_bytes=1 << 20)
    encode({"y": y}, Format.MSGPACK, limits)
    with pytest.raises(ResponseTooLarge):
        encode({"y": y}, Format.JSON, limits)


@pytest.mark.parametrize(
    "array",
    [
        np.random.default_rng(0).standard_normal((50, 20)).astype(np.float32),
        np.random.default_rng(0).standard_normal((50, 20)),
        np.arange(-500, 500, dtype=np.int64).reshape(10, 100),
        np.arange(1000, dtype=np.uint8),
        np.ones((4, 5, 6), dtype=bool),
        np.array([b"abc", b"de"], dtype=object),
    ],
)
def test_the_json_estimate_is_not_below_the_real_size(array: np.ndarray) -> None:
    real = len(encode({"y": array}, Format.JSON))
    assert real <= json_bytes(array) + 64
    if array.dtype.kind == "f":  # and close for floats, the usual outputs
        assert json_bytes(array) < 1.6 * real
