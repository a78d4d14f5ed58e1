from __future__ import annotations

import msgpack
import msgpack_numpy
import numpy as np
import orjson
import pytest

from fnrt.functions.codec import (
    Format,
    NotJsonNumber,
    _encode_arrays,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
    format_of,
    negotiate,
)
from fnrt.functions.errors import BadRequest, UnsupportedMediaType


@pytest.mark.parametrize(
    "dtype", ["bool", "uint8", "int16", "int32", "int64", "float16", "float32", "float64"]
)
def test_msgpack_numpy_compatible_both_ways(dtype: str) -> None:
    x = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    ours = decode_msgpack(msgpack.packb({"x": x}, default=msgpack_numpy.encode))["x"]
    np.testing.assert_array_equal(ours, x)
    assert ours.dtype == x.dtype
    theirs = msgpack.unpackb(encode_msgpack({"x": x}), object_hook=msgpack_numpy.decode)["x"]
    np.testing.assert_array_equal(theirs, x)


def test_decoding_does_not_copy_the_data() -> None:
    body = msgpack.packb({"x": np.ones((256, 256), np.float32)}, default=msgpack_numpy.encode)
    x = decode_msgpack(body)["x"]
    assert not x.flags.owndata  # a view over the received bytes
    assert not x.flags.writeable


def test_non_contiguous_and_big_endian_arrays_encode() -> None:
    x = np.arange(20, dtype=">i4").reshape(4, 5)[:, ::2]
    out = msgpack.unpackb(encode_msgpack({"x": x}), object_hook=msgpack_numpy.decode)["x"]
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        (
            {b"nd": True, b"type": "|O", b"kind": b"O", b"shape": [1], b"data": b"x"},
            "object or structured",
        ),
        (
            {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [2], b"data": b"abc"},
            "needs 8 bytes, got 3",
        ),
        (
            {b"nd": True, b"type": "<U3", b"kind": b"", b"shape": [1], b"data": b"abcabcabcabc"},
            "not a numeric",
        ),
        ({b"nd": True, b"type": "zz", b"kind": b"", b"shape": [1], b"data": b""}, "unknown dtype"),
        ({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [-1], b"data": b""}, "non-negative"),
        (
            {b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [1.0], b"data": b"1234"},
            "integers",
        ),
        ({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": "1", b"data": b"1234"}, "integers"),
        ({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [1], b"data": "1234"}, "raw bytes"),
        ({b"nd": False, b"type": "<f4", b"kind": b"", b"shape": [], b"data": b"12"}, "scalar data"),
        ({"nd": True, "type": "<f4", "kind": "", "shape": [2], "data": b"123"}, "needs 8 bytes"),
        ({"nd": True, "type": [1], "kind": "", "shape": [1], "data": b"1234"}, "unknown dtype"),
    ],
)
def test_bad_arrays_are_bad_requests(payload: dict, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        decode_msgpack(msgpack.packb({"x": payload}))


def test_json_round_trip_and_errors() -> None:
    assert decode_json(b'{"x": [[1, 2]]}') == {"x": [[1, 2]]}
    assert encode_json({"y": np.array([[1.5, 2.0]], np.float32)}) == b'{"y":[[1.5,2.0]]}'
    assert encode_json({"y": np.array([1, 2], ">i4")}) == b'{"y":[1,2]}'
    with pytest.raises(BadRequest, match="not valid JSON"):
        decode_json(b"{")
    with pytest.raises(BadRequest, match="must be a map"):
        decode_json(b"[]")
    with pytest.raises(BadRequest, match="input names must be strings"):
        decode_msgpack(msgpack.packb({1: 2}))


def test_content_negotiation() -> None:
    assert format_of(None) is Format.JSON
    assert format_of("application/msgpack; charset=binary") is Format.MSGPACK
    assert format_of("application/x-msgpack") is Format.MSGPACK
    with pytest.raises(UnsupportedMediaType):
        format_of("text/csv")
    assert negotiate(None, Format.MSGPACK) is Format.MSGPACK
    assert negotiate("*/*", Format.MSGPACK) is Format.MSGPACK
    assert negotiate("text/html, application/json;q=0.9", Format.MSGPACK) is Format.JSON
    with pytest.raises(UnsupportedMediaType):
        negotiate("text/html", Format.JSON)


def test_a_zero_dimensional_array_keeps_its_shape() -> None:
    """Found by the decoder fuzz: 0-d arrays came back with shape [1]."""
    back = decode_msgpack(encode_msgpack({"y": np.full((), 2.5, dtype=np.float32)}))["y"]
    assert back.shape == () and float(back) == 2.5


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_json_refuses_nan_and_infinities_rather_than_writing_null(bad: float) -> None:
    import ml_dtypes

    for dtype in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16):
        with pytest.raises(NotJsonNumber, match="output 'y' holds NaN or infinite"):
            encode_json({"y": np.array([1.0, bad], dtype=dtype)})
    assert encode_json({"y": np.array([1.0, 2.5], np.float32)}) == b'{"y":[1.0,2.5]}'
    assert encode_json({"n": np.array([0, 1], np.int64), "s": "text"}) == b'{"n":[0,1],"s":"text"}'
    # a null that is data, not a NaN written as one, passes
    assert encode_json({"y": np.array([1.0], np.float32), "s": "null", "z": None}) == (
        b'{"y":[1.0],"s":"null","z":null}'
    )
    kept = decode_msgpack(encode_msgpack({"y": np.array([bad], np.float32)}))["y"]
    np.testing.assert_array_equal(kept, [bad])  # msgpack carries them as they are


@pytest.mark.parametrize("keys", ["bytes", "str"])
def test_an_array_decodes_the_same_whatever_its_keys_and_however_often(keys: str) -> None:
    array = np.arange(6, dtype=">i4").reshape(2, 3)  # big-endian: made little on the way in
    layout = {"nd": True, "type": ">i4", "kind": "", "shape": [2, 3], "data": array.tobytes()}
    if keys == "bytes":
        layout = {k.encode(): v for k, v in layout.items()}
    for _ in range(3):  # its dtype string is looked up once, then known
        got = decode_msgpack(msgpack.packb({"x": layout}))["x"]
        assert got.dtype == np.dtype("<i4") and got.tolist() == array.tolist()
    with pytest.raises(BadRequest, match="unknown dtype 'zz'"):  # nothing known of a bad one
        type_key = b"type" if keys == "bytes" else "type"
        decode_msgpack(msgpack.packb({"x": {**layout, type_key: "zz"}}))


def _packed_the_general_way(payload: dict) -> bytes:
    from fnrt.functions.codec import _default

    return msgpack.packb(payload, default=_default, use_bin_type=True)


@pytest.mark.parametrize(
    "dtype", ["bool", "uint8", "int8", "int64", "uint64", "float16", "float32", "<f8", "bfloat16"]
)
@pytest.mark.parametrize("shape", [(), (0,), (1, 4), (3, 0, 2), (70_000,)])
def test_an_answer_of_arrays_packs_to_the_same_bytes_as_msgpack_does(dtype: str, shape) -> None:
    import ml_dtypes  # noqa: F401  (numpy reads "bfloat16" once it is imported)

    array = (np.arange(int(np.prod(shape))) % 3).astype(dtype).reshape(shape)
    for payload in ({"y": array}, {"y": array, "é": array.copy(), "z" * 40: array}):
        assert _encode_arrays(payload) is not None  # packed here, not by msgpack
        for _ in range(2):  # made, then known
            assert encode_msgpack(payload) == _packed_the_general_way(payload)
        decoded = decode_msgpack(encode_msgpack(payload))
        assert decoded.keys() == payload.keys()
        assert all(v.tobytes() == array.tobytes() and v.shape == shape for v in decoded.values())


@pytest.mark.parametrize(
    "payload",
    [
        {"y": np.arange(6, dtype=">i4").reshape(2, 3)},  # big-endian: made little first
        {"y": np.arange(6, dtype="<i4").reshape(2, 3).T},  # not C order
        {"y": np.array([b"a", b"bc"], dtype=object)},  # bytes elements
        {"y": 3, "z": np.zeros(2)},
        {f"y{i}": np.zeros(2) for i in range(16)},  # past a fixmap
    ],
)
def test_other_answers_are_packed_the_general_way(payload: dict) -> None:
    assert _encode_arrays(payload) is None
    assert encode_msgpack(payload) == _packed_the_general_way(payload)


def test_what_the_packer_keeps_is_bounded() -> None:
    from fnrt.functions import codec

    for i in range(codec._KEPT + 10):  # an echo whose clients name every input anew
        encode_msgpack({f"x{i}": np.zeros((1, i % 7 + 1), np.float32)})
        encode_msgpack({"y": np.zeros(i + 1, np.uint8)})
    assert len(codec._PACKED_NAMES) <= codec._KEPT
    assert len(codec._ARRAY_HEADS) <= codec._KEPT
    assert encode_msgpack({}) == _packed_the_general_way({})
    assert encode_msgpack({"x": np.ones(3)}) == _packed_the_general_way({"x": np.ones(3)})


def test_a_body_nested_too_deep_says_so() -> None:
    with pytest.raises(BadRequest, match="not valid msgpack: nested too deep"):
        decode_msgpack(b"\x81\xa1x" + b"\x91" * 100_000 + b"\x00")


@pytest.mark.parametrize(
    ("body", "numbers"),
    [
        (b'{"x": [[1, 2.5, -3e4, true]]}', True),
        (b'{"x": [[1]], "y": [2, 3]}', True),
        (b'{"x": [], "y": 5}', True),
        (b'{"x": [["1.5"]]}', False),  # a string among the values
        (b'{"x": [[1]], "y": "a"}', False),
        (b'{"x": [[null]]}', True),  # no string: null is NaN to numpy, refused after
        (b'{"x\\"y": [[1]]}', False),  # a key's escaped quote: not sure, so not
        (b'{"x": [[{}]]}', True),  # an empty object, refused after
        (b'{"x": [[{"a": 1}]]}', False),
    ],
)
def test_a_json_body_says_when_its_values_hold_no_string(body: bytes, numbers: bool) -> None:
    from fnrt.functions.numbers import Numbers

    decoded = decode_json(body)
    assert (type(decoded) is Numbers) is numbers
    assert decoded == orjson.loads(body)
